// Package ascii holds the one check of printable ASCII (0x20 to 0x7E)
// that keys, fingerprints, owner tokens, operation names and key prefixes
// share.
package ascii

// IndexNotPrintable is the index of the first byte of s outside printable
// ASCII (0x20 to 0x7E), or -1 if there is none.
func IndexNotPrintable(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return i
		}
	}
	return -1
}
