package idempotency

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/go-idempotency/idempotency/backend"
)

// progress is what an unfinished key saves of its [Operation]: the step it
// resumes at, the caller's input, the step data and the last failure.
type progress struct {
	Op      string
	Step    string // the next step to run; "" for Finish
	Input   []byte
	Data    map[string]string
	Failure string
	// sealed, when set, is Input and Data as the Codec's SealData sealed them
	// (Input and Data are then unset): the progress of a Guard with a
	// Codec, read back and not yet opened ([Guard.openProgress]).
	sealed []byte
}

// progressMagic starts every encoded progress in clear; "1" names the
// format:
//
//	"idp1" || field(op) || field(step) || field(input) || field(failure) ||
//	uvarint(len(data)) || for each name in byte order: field(name) || field(value)
//
// with field(s) = uvarint(len(s)) || s. sealedMagic starts the progress of
// a Guard with a Codec, whose input and step data are sealed:
//
//	"ids1" || field(op) || field(step) || field(failure) || field(sealed)
//
// where sealed is what the Codec's SealData returned for the clear
// encoding of a progress holding only the input and the data. The
// operation, the step and the failure stay in clear, as a sealed answer's
// status does: the [Completer] and operators read them without the keys.
// The magic itself is how every reader tells that the row is sealed.
const (
	progressMagic = "idp1"
	sealedMagic   = "ids1"
)

// errProgress: saved progress that cannot be decoded.
var errProgress = errors.New("idempotency: saved progress is corrupt")

func (p progress) clone() progress {
	p.Data = clonedData(p.Data)
	return p
}

// encode returns p's bytes, or an error wrapping [ErrTooLarge] if they
// exceed [backend.MaxProgressLen].
func (p progress) encode() ([]byte, error) {
	field := func(b []byte, s string) []byte {
		b = binary.AppendUvarint(b, uint64(len(s)))
		return append(b, s...)
	}
	if p.sealed != nil {
		b := []byte(sealedMagic)
		for _, f := range [...]string{p.Op, p.Step, p.Failure, string(p.sealed)} {
			b = field(b, f)
		}
		return checkProgressLen(b)
	}
	b := []byte(progressMagic)
	b = field(b, p.Op)
	b = field(b, p.Step)
	b = binary.AppendUvarint(b, uint64(len(p.Input)))
	b = append(b, p.Input...)
	b = field(b, p.Failure)
	names := make([]string, 0, len(p.Data))
	for k := range p.Data {
		names = append(names, k)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, k := range names {
		b = field(b, k)
		b = field(b, p.Data[k])
	}
	return checkProgressLen(b)
}

func checkProgressLen(b []byte) ([]byte, error) {
	if len(b) > backend.MaxProgressLen {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrTooLarge, len(b), backend.MaxProgressLen)
	}
	return b, nil
}

// decodeProgress parses what encode wrote. Sealed progress comes back
// with its input and data still sealed.
func decodeProgress(b []byte) (progress, error) {
	var p progress
	magic := ""
	if len(b) >= len(progressMagic) {
		magic = string(b[:len(progressMagic)])
	}
	if magic != progressMagic && magic != sealedMagic {
		return p, fmt.Errorf("%w: no %q or %q header", errProgress, progressMagic, sealedMagic)
	}
	b = b[len(progressMagic):]
	next := func() ([]byte, error) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, fmt.Errorf("%w: truncated", errProgress)
		}
		s := b[k : k+int(n)]
		b = b[k+int(n):]
		return s, nil
	}
	var fields [4][]byte
	for i := range fields {
		f, err := next()
		if err != nil {
			return p, err
		}
		fields[i] = f
	}
	if magic == sealedMagic {
		if len(b) != 0 {
			return p, fmt.Errorf("%w: %d trailing bytes", errProgress, len(b))
		}
		p.Op, p.Step, p.Failure = string(fields[0]), string(fields[1]), string(fields[2])
		p.sealed = append([]byte{}, fields[3]...) // never nil: it marks the progress sealed
		return p, nil
	}
	p.Op, p.Step, p.Failure = string(fields[0]), string(fields[1]), string(fields[3])
	if len(fields[2]) > 0 {
		p.Input = slices.Clone(fields[2])
	}
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return p, fmt.Errorf("%w: bad data count", errProgress)
	}
	b = b[k:]
	if n > 0 {
		p.Data = make(map[string]string, n)
	}
	prev := ""
	for i := uint64(0); i < n; i++ {
		name, err := next()
		if err != nil {
			return p, err
		}
		value, err := next()
		if err != nil {
			return p, err
		}
		if i > 0 && string(name) <= prev {
			return p, fmt.Errorf("%w: data names out of order", errProgress)
		}
		prev = string(name)
		p.Data[prev] = string(value)
	}
	if len(b) != 0 {
		return p, fmt.Errorf("%w: %d trailing bytes", errProgress, len(b))
	}
	return p, nil
}
