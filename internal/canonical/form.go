package canonical

import (
	"fmt"
	"slices"
	"strings"
)

// Form rewrites an application/x-www-form-urlencoded body
// canonically, so that two bodies give the same bytes exactly when
// [net/url.ParseQuery] (what http.Request.ParseForm uses) reads the same
// url.Values from them:
//
//   - the name=value pairs sorted by name, byte-wise on the decoded bytes;
//     the values of one name keep the order they were sent in (a=2&a=1 is
//     not a=1&a=2);
//   - each name and value percent-encoded one way: the unreserved bytes
//     A-Z a-z 0-9 - . _ ~ as themselves, every other byte as %XX in upper
//     case (a space is %20; "+", "%20" and "%2b" are decoded first);
//   - every pair written name=value, a name sent without "=" included
//     ("a" and "a=" are the same parameter with an empty value); empty
//     pieces ("a=1&&b=2", a trailing "&") dropped, as ParseQuery drops them.
//
// It refuses, with an error wrapping [ErrInvalid], what ParseQuery
// refuses: a "%" not followed by two hexadecimal digits, and a ";" (no
// longer a separator since Go 1.17). Decoded bytes are compared as bytes:
// they need not be UTF-8. The empty body is the empty form.
//
// The order of different names is not part of the meaning: a handler that
// reads the raw body's order across names (a parser of "items[]" names that
// pairs each item[]price with the item[]qty after it, as Rails does) must
// fingerprint the body as bytes instead.
func Form(data []byte) ([]byte, error) {
	type pair struct{ name, value string }
	var pairs []pair
	for rest := string(data); rest != ""; {
		var piece string
		piece, rest, _ = strings.Cut(rest, "&")
		if piece == "" {
			continue
		}
		if strings.Contains(piece, ";") {
			return nil, fmt.Errorf("%w: a ';' in %q (not a separator; send it as %%3B)", errInvalidForm, clip(piece))
		}
		rawName, rawValue, _ := strings.Cut(piece, "=")
		name, err := formUnescape(rawName)
		if err != nil {
			return nil, err
		}
		value, err := formUnescape(rawValue)
		if err != nil {
			return nil, err
		}
		pairs = append(pairs, pair{name, value})
	}
	slices.SortStableFunc(pairs, func(a, b pair) int { return strings.Compare(a.name, b.name) })
	out := make([]byte, 0, len(data)+len(data)/2)
	for i, p := range pairs {
		if i > 0 {
			out = append(out, '&')
		}
		out = appendFormEscaped(out, p.name)
		out = append(out, '=')
		out = appendFormEscaped(out, p.value)
	}
	return out, nil
}

// formUnescape decodes one name or value as url.QueryUnescape does: "+" is
// a space and %XX the byte XX.
func formUnescape(s string) (string, error) {
	if !strings.ContainsAny(s, "%+") {
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '+':
			b = append(b, ' ')
		case '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return "", fmt.Errorf("%w: a '%%' not followed by two hexadecimal digits in %q", errInvalidForm, clip(s[i:]))
			}
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		default:
			b = append(b, c)
		}
	}
	return string(b), nil
}

// appendFormEscaped appends s with every byte but the unreserved ones as %XX.
func appendFormEscaped(b []byte, s string) []byte {
	const upperHex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b = append(b, c)
			continue
		}
		b = append(b, '%', upperHex[c>>4], upperHex[c&0xf])
	}
	return b
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

// clip shortens s for an error message: a form body may be large.
func clip(s string) string {
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}
