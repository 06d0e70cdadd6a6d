package main

import (
	"errors"
	"strings"
	"testing"
)

// TestKeyringErrorsShowNoContent: every error about a malformed keyring
// file names the line and what is wrong, never a field of the file: not a
// key, nor a key id (a key written in the id's column would be shown).
func TestKeyringErrorsShowNoContent(t *testing.T) {
	t.Parallel()
	k1, k2 := newKeyHex(t), newKeyHex(t)
	const id1, id2, idUnknown = "ring-alpha-2026", "ring-beta-2027", "ring-gamma-2028"
	notHex := k2[:20] + "zz" + k2[22:]
	longID := k2 + "x" // 65 bytes: too long for sealed
	secrets := []string{k1, k2, notHex, longID, k1[:16], k2[:16], k1[len(k1)-16:], k2[len(k2)-16:], k2[22:38],
		id1, id2, idUnknown, "cl\u00e9-1", "ctl\x01id"}
	for name, tc := range map[string]struct{ content, want string }{
		"swapped": {"# ring\n" + id1 + " " + k1 + "\n" + k2 + " " + id2 + "\n",
			"line 3: the key is 14 characters, want 64 hexadecimal digits; the key id looks like a key: write the id first, then the key"},
		"short":           {id1 + " " + k1[:62] + "\n", "line 1: the key is 62 characters, want 64 hexadecimal digits"},
		"not hex":         {id1 + " " + notHex + "\n", "line 1: the key is not hexadecimal"},
		"duplicate id":    {id1 + " " + k1 + "\n\n" + id1 + " " + k2 + "\n", "line 3: the key id of line 1 again"},
		"unknown current": {id1 + " " + k1 + "\ncurrent " + idUnknown + "\n", "line 2: current names a key id that no line defines"},
		"second current":  {id1 + " " + k1 + "\ncurrent " + id1 + "\ncurrent " + id1 + "\n", "line 3: a second current line"},
		"one field":       {k1 + "\n", "line 1 has 1 fields, want 2"},
		"three fields":    {id1 + " " + k1 + " " + k2 + "\n", "line 1 has 3 fields, want 2"},
		"id too long":     {longID + " " + k1 + "\n", "line 1: the key id is not 1 to 64 printable ASCII characters"},
		"id not ascii":    {"cl\u00e9-1 " + k1 + "\n", "line 1: the key id is not 1 to 64 printable ASCII characters"},
		"id control byte": {"ctl\x01id " + k1 + "\n", "line 1: the key id is not 1 to 64 printable ASCII characters"},
		"no key":          {"# " + k1 + "\n", "no key"},
	} {
		_, err := loadKeyring(writeKeyring(t, tc.content, 0o600))
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "malformed keyring: "+tc.want) {
			t.Errorf("%s: %v, want a usage error saying %q", name, err, tc.want)
		}
		if err == nil {
			continue
		}
		for _, s := range secrets {
			if strings.Contains(err.Error(), s) {
				t.Errorf("%s: the error shows %q of the file: %v", name, s, err)
			}
		}
	}
}
