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
	// A record stored in clear is shown as it is, with or without a
	// keyring; one a Guard marked sealed never is (sealed refuses it,
	// damaged or sealed by another codec: idempotency.StoredSealed).
	kr.AcceptPlain = true
	c, err := sealed.New(kr) // copies the keys
	if err != nil {
		// parseKeyring checked all that New checks; New's errors quote
		// key ids, which may be keys written in the wrong column.
		return nil, usagef("-keyring %s: the keyring is refused by package sealed", path)
	}
	return c, nil
}

// errKeyring is the error of a malformed keyring file.
var errKeyring = errors.New("malformed keyring")

// parseKeyring reads a keyring file's content. Without a "current" line
// the first key is the current one: idemctl only opens records, with any
// key of the ring. Its errors name a line and what is wrong with it,
// never a field: a key id may be a key written in the wrong column. It
// checks all that [sealed.New] checks, whose errors quote the ids.
func parseKeyring(data []byte) (sealed.Keyring, error) {
	kr := sealed.Keyring{Keys: map[string][]byte{}}
	first := ""
	lineOf := map[string]int{} // the line of each key id
	currentLine := 0
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
			if currentLine != 0 {
				return kr, fmt.Errorf("%w: line %d: a second current line", errKeyring, n)
			}
			kr.Current, currentLine = value, n
			continue
		}
		if len(value) != 2*sealed.KeySize {
			hint := ""
			if isKeyHex(id) {
				hint = "; the key id looks like a key: write the id first, then the key"
			}
			return kr, fmt.Errorf("%w: line %d: the key is %d characters, want %d hexadecimal digits%s", errKeyring, n, len(value), 2*sealed.KeySize, hint)
		}
		if !validKeyID(id) {
			return kr, fmt.Errorf("%w: line %d: the key id is not 1 to %d printable ASCII characters", errKeyring, n, sealed.MaxKeyIDLen)
		}
		if prev, dup := lineOf[id]; dup {
			return kr, fmt.Errorf("%w: line %d: the key id of line %d again", errKeyring, n, prev)
		}
		key := make([]byte, sealed.KeySize)
		if _, err := hex.Decode(key, []byte(value)); err != nil {
			// hex's error quotes the offending digit: keep it out.
			clear(key)
			return kr, fmt.Errorf("%w: line %d: the key is not hexadecimal", errKeyring, n)
		}
		kr.Keys[id] = key
		lineOf[id] = n
		if first == "" {
			first = id
		}
	}
	if err := sc.Err(); err != nil {
		// The scanner's errors (a line too long) quote nothing of the file.
		return kr, fmt.Errorf("%w: %v", errKeyring, err)
	}
	if len(kr.Keys) == 0 {
		return kr, fmt.Errorf("%w: no key: %s", errKeyring, keyringHelp)
	}
	if currentLine == 0 {
		kr.Current = first
	} else if _, ok := kr.Keys[kr.Current]; !ok {
		// sealed.New would refuse it too, quoting the id.
		return kr, fmt.Errorf("%w: line %d: current names a key id that no line defines", errKeyring, currentLine)
	}
	return kr, nil
}

// validKeyID reports whether id is a key id [sealed.New] accepts: 1 to
// [sealed.MaxKeyIDLen] bytes of printable ASCII without space.
func validKeyID(id string) bool {
	if id == "" || len(id) > sealed.MaxKeyIDLen {
		return false
	}
	for i := range len(id) {
		if id[i] <= ' ' || id[i] > '~' {
			return false
		}
	}
	return true
}

// isKeyHex reports whether s has the form of a key: 64 hexadecimal digits.
func isKeyHex(s string) bool {
	if len(s) != 2*sealed.KeySize {
		return false
	}
	for i := range len(s) {
		if !strings.ContainsRune("0123456789abcdefABCDEF", rune(s[i])) {
			return false
		}
	}
	return true
}
