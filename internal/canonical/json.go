// Package canonical rewrites request bodies canonically, so that two
// bodies that mean the same give the same bytes: JSON (RFC 8259) and
// application/x-www-form-urlencoded. Package idempotency fingerprints
// them (FingerprintJSON, FingerprintForm); idemhttp fingerprints a body by
// its content type.
package canonical

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// JSON rewrites one JSON value (RFC 8259) canonically, so that two
// texts give the same bytes exactly when they hold the same value:
//
//   - object members sorted by name, byte-wise on their UTF-8 (which is
//     code point order); no insignificant whitespace;
//   - strings written one way: \" and \\, \b \f \n \r \t, \u00xx for the
//     other control characters and \u2028 \u2029; every other character
//     as itself in UTF-8;
//   - numbers compared by exact decimal value, of any size and exponent:
//     written as [-]D[.DDD]eN, the significant digits with no leading or
//     trailing zero and the exponent N in decimal (1, 1.0, 10e-1 and
//     0.1E+1 all give 1e0); zero, -0 included, is 0.
//
// It refuses with an error wrapping [ErrInvalid]:
//
//   - anything but exactly one JSON value (surrounding whitespace allowed);
//   - bytes that are not UTF-8;
//   - a \u escape of an unpaired UTF-16 surrogate;
//   - an object with the same member name twice (its meaning depends on
//     the parser);
//   - nesting deeper than 10000 levels.
//
// The output costs time and memory linear in len(data), whatever the
// numbers: an exponent is never expanded into digits.
func JSON(data []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: %w", errInvalidJSON, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: data after the first value", errInvalidJSON)
	}
	// data is now one syntactically valid JSON value. encoding/json maps
	// invalid UTF-8 and unpaired surrogates to U+FFFD, which would make
	// different texts collide: refuse them.
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("%w: not valid UTF-8", errInvalidJSON)
	}
	if i, found := loneSurrogate(data); found {
		return nil, fmt.Errorf("%w: unpaired UTF-16 surrogate escape at byte %d", errInvalidJSON, i)
	}
	if err := checkDuplicates(data); err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(data))
	return appendCanonical(b, v)
}

// loneSurrogate finds the first \u escape in data that encodes a UTF-16
// surrogate not paired with its other half, and returns its offset. The
// data must be one syntactically valid JSON text. Outside strings it holds
// no backslash, and inside them every backslash starts an escape.
func loneSurrogate(data []byte) (int, bool) {
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		i++ // the escaped character, skipped whatever it is
		if data[i] != 'u' {
			continue
		}
		r := hex4(data[i+1 : i+5])
		if !utf16.IsSurrogate(r) {
			continue // the hex digits hold no backslash: no need to skip them
		}
		// A high surrogate must be followed at once by an escaped low one.
		// The text is valid JSON: a string closes after any escape, so
		// data[i+5] exists, and after a backslash and a u four hex digits
		// follow.
		if r < 0xdc00 && bytes.HasPrefix(data[i+5:], []byte(`\u`)) {
			if lo := hex4(data[i+7 : i+11]); lo >= 0xdc00 && lo <= 0xdfff {
				i += 10
				continue
			}
		}
		return i - 1, true
	}
	return 0, false
}

// hex4 decodes four hexadecimal digits that the JSON scanner has checked.
func hex4(h []byte) rune {
	var v [2]byte
	_, _ = hex.Decode(v[:], h) // cannot fail on checked digits
	return rune(v[0])<<8 | rune(v[1])
}

func appendCanonical(b []byte, v any) ([]byte, error) {
	var err error
	switch v := v.(type) {
	case nil:
		b = append(b, "null"...)
	case bool:
		b = strconv.AppendBool(b, v)
	case json.Number:
		b = appendNumber(b, string(v))
	case string:
		b = appendString(b, v)
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendCanonical(b, e); err != nil {
				return nil, err
			}
		}
		b = append(b, ']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, k)
			b = append(b, ':')
			if b, err = appendCanonical(b, v[k]); err != nil {
				return nil, err
			}
		}
		b = append(b, '}')
	default:
		return nil, fmt.Errorf("%w: unexpected %T", errInvalidJSON, v)
	}
	return b, nil
}

// appendString appends s, valid UTF-8, as a JSON string in the one escaping
// JSON uses. It is written out rather than left to encoding/json so
// that fingerprints do not change with the Go release.
func appendString(b []byte, s string) []byte {
	const (
		short   = "\"\\\b\f\n\r\t" // written as a backslash and the letter below
		letters = `"\bfnrt`
		hexits  = "0123456789abcdef"
	)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		if j := strings.IndexByte(short, c); j >= 0 {
			b = append(b, '\\', letters[j])
		} else if c < 0x20 {
			b = append(b, '\\', 'u', '0', '0', hexits[c>>4], hexits[c&0xf])
		} else if strings.HasPrefix(s[i:], "\u2028") {
			b = append(b, `\u2028`...)
			i += 2
		} else if strings.HasPrefix(s[i:], "\u2029") {
			b = append(b, `\u2029`...)
			i += 2
		} else {
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// appendNumber appends the canonical form of lit, a JSON number literal the
// scanner has checked: [-]D[.DDD]eN, with the significant digits stripped of
// leading and trailing zeros; zero (-0 included) is "0".
func appendNumber(b []byte, lit string) []byte {
	neg := lit[0] == '-'
	if neg {
		lit = lit[1:]
	}
	mant, exp, found := strings.Cut(lit, "e")
	if !found {
		mant, exp, _ = strings.Cut(lit, "E")
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return append(b, '0')
	}
	sig := strings.TrimRight(digits, "0")
	// The value is digits * 10^(exp-len(frac)); written as D.DDD it is
	// sig[0].sig[1:] * 10^(exp-len(frac)+len(digits)-1).
	if neg {
		b = append(b, '-')
	}
	b = append(b, sig[0])
	if len(sig) > 1 {
		b = append(b, '.')
		b = append(b, sig[1:]...)
	}
	b = append(b, 'e')
	return appendExponent(b, exp, len(digits)-1-len(frac))
}

// lowBase is the base of the low 18 digits of a long exponent, added to as an int64.
const lowBase = 1e18

// appendExponent appends the decimal value of lit + shift. Here lit is a
// JSON exponent ([+-]digits, or empty for 0) of any length. |shift| is
// below 1e18, as the length of the input bounds it. The sum is done on
// the decimal digits, in time linear in len(lit): math/big would take time
// quadratic in the number of digits.
func appendExponent(b []byte, lit string, shift int) []byte {
	neg := strings.HasPrefix(lit, "-")
	mag := strings.TrimLeft(strings.TrimLeft(lit, "+-"), "0")
	if len(mag) < 19 { // below 1e18: int64 cannot overflow
		e, _ := strconv.ParseInt(mag, 10, 64) // 0 for an empty mag
		if neg {
			e = -e
		}
		return strconv.AppendInt(b, e+int64(shift), 10)
	}
	// |lit| >= 1e18 > |shift|: the sum has lit's sign, and its magnitude is
	// mag + shift (or mag - shift for a negative lit).
	d := int64(shift)
	if neg {
		d = -d
		b = append(b, '-')
	}
	head, tail := mag[:len(mag)-18], mag[len(mag)-18:]
	lo, _ := strconv.ParseInt(tail, 10, 64)
	lo += d // in (-1e18, 2e18): at most one carry into head
	if lo >= lowBase {
		lo -= lowBase
		head = carry(head, '9', '0', 1)
	} else if lo < 0 {
		lo += lowBase
		head = carry(head, '0', '9', -1)
	}
	head = strings.TrimLeft(head, "0") // a borrow from "1000..." leaves "0999..."
	b = append(b, head...)
	loDigits := strconv.FormatInt(lo, 10)
	if head != "" {
		b = append(b, "000000000000000000"[len(loDigits):]...)
	}
	return append(b, loDigits...)
}

// carry adds d (+1 or -1) to the decimal digits s: trailing digits equal to
// wrap (9 when adding, 0 when subtracting) become to, and the digit before
// them moves by d. Adding to all nines prefixes a 1; subtracting is only
// asked of a positive s.
func carry(s string, wrap, to byte, d int) string {
	buf := []byte(s)
	i := len(buf) - 1
	for i >= 0 && buf[i] == wrap {
		buf[i] = to
		i--
	}
	if i < 0 {
		return "1" + string(buf)
	}
	buf[i] = byte(int(buf[i]) + d)
	return string(buf)
}

// checkDuplicates walks the token stream and refuses an object that has the
// same member name twice.
func checkDuplicates(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		obj    bool
		keys   map[string]bool
		expKey bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %w", errInvalidJSON, err)
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.obj && top.expKey {
			if d, ok := tok.(json.Delim); !ok || d != '}' {
				k := tok.(string)
				if top.keys[k] {
					return fmt.Errorf("%w: duplicate object key %q", errInvalidJSON, k)
				}
				top.keys[k] = true
				top.expKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, keys: map[string]bool{}, expKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].obj {
			stack[len(stack)-1].expKey = true
		}
	}
}

// ErrInvalid: the bytes are not one valid JSON value, or not a form body
// as net/url parses it. Package idempotency exports it as ErrInvalidBody.
var ErrInvalid = errors.New("idempotency: invalid body")

// errInvalidJSON and errInvalidForm are [ErrInvalid] for each format, with
// a message that names the format.
var (
	errInvalidJSON error = bodyError("idempotency: invalid JSON")
	errInvalidForm error = bodyError("idempotency: invalid form body")
)

// bodyError is an [ErrInvalid] with a message of its own.
type bodyError string

func (e bodyError) Error() string        { return string(e) }
func (e bodyError) Is(target error) bool { return target == ErrInvalid }
