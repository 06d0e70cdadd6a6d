package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/go-idempotency/idempotency/sealed"
)

// maxKeyringFile bounds the -keyring file: a ring of a thousand keys fits
// in a tenth of it.
const maxKeyringFile = 1 << 20

// keyringHelp describes the -keyring file, for the package doc and errors.
const keyringHelp = `a keyring file has one key a line, "ID HEX" (the key id, then its 32 bytes as 64 hexadecimal digits), ` +
	`and may name the current key with a line "current ID"; blank lines and lines starting with # are ignored`

// loadKeyring reads the -keyring file at path and returns the Codec of
// its keys. The file must be a regular file that only its owner can read
// or write (mode 0600 or 0400): a keyring others can read is refused, as
// ssh refuses such a private key. Nothing of the file's content is ever
// put in an error: a mistake is named by its line number.
func loadKeyring(path string) (*sealed.Codec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, usagef("-keyring: %v", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, usagef("-keyring: %v", err)
	}
	if !st.Mode().IsRegular() {
		return nil, usagef("-keyring %s: not a regular file", path)
	}
	if perm := st.Mode().Perm(); runtime.GOOS != "windows" && perm&0o077 != 0 {
		return nil, usagef("-keyring %s: mode %04o lets others read or change the keys; chmod 600 it", path, perm)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKeyringFile+1))
	if err != nil {
		return nil, usagef("-keyring %s: %v", path, err)
	}
	defer clear(data)
	if len(data) > maxKeyringFile {
		return nil, usagef("-keyring %s: larger than %d bytes", path, maxKeyringFile)
	}
	kr, err := parseKeyring(data)
	if err != nil {
		return nil, usagef("-keyring %s: %v", path, err)
	}
	defer func() {
		for _, k := range kr.Keys {
			clear(k)
		}
	}()
	c, err := sealed.New(kr) // copies the keys
	if err != nil {
		return nil, usagef("-keyring %s: %v", path, err)
	}
	return c, nil
}

// errKeyring is the error of a malformed keyring file.
var errKeyring = errors.New("malformed keyring")

// parseKeyring reads a keyring file's content. Without a "current" line
// the first key is the current one: idemctl only opens records, with any
// key of the ring.
func parseKeyring(data []byte) (sealed.Keyring, error) {
	kr := sealed.Keyring{Keys: map[string][]byte{}}
	first := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), maxKeyringFile)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return kr, fmt.Errorf("%w: line %d has %d fields, want 2: %s", errKeyring, n, len(fields), keyringHelp)
		}
		id, value := fields[0], fields[1]
		if id == "current" {
			if kr.Current != "" {
				return kr, fmt.Errorf("%w: line %d: a second current line", errKeyring, n)
			}
			kr.Current = value
			continue
		}
		if _, dup := kr.Keys[id]; dup {
			return kr, fmt.Errorf("%w: line %d: key id %q twice", errKeyring, n, id)
		}
		key := make([]byte, sealed.KeySize)
		if len(value) != 2*sealed.KeySize {
			return kr, fmt.Errorf("%w: line %d: the key of %q is %d characters, want %d hexadecimal digits", errKeyring, n, id, len(value), 2*sealed.KeySize)
		}
		if _, err := hex.Decode(key, []byte(value)); err != nil {
			// hex's error quotes the offending digit: keep it out.
			return kr, fmt.Errorf("%w: line %d: the key of %q is not hexadecimal", errKeyring, n, id)
		}
		kr.Keys[id] = key
		if first == "" {
			first = id
		}
	}
	if err := sc.Err(); err != nil {
		return kr, fmt.Errorf("%w: %v", errKeyring, err)
	}
	if len(kr.Keys) == 0 {
		return kr, fmt.Errorf("%w: no key: %s", errKeyring, keyringHelp)
	}
	if kr.Current == "" {
		kr.Current = first
	}
	return kr, nil
}
