package sqlident

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for name, ok := range map[string]bool{
		"idempotency_keys":      true,
		"_k":                    true,
		"K9":                    true,
		"a":                     true,
		strings.Repeat("a", 63): true,
		strings.Repeat("a", 64): false,
		"":                      false,
		"9keys":                 false,
		"keys;drop":             false,
		"ké":                    false,
		"a b":                   false,
		"a.b":                   false,
		`a"b`:                   false,
		"a-b":                   false,
		"a\x00":                 false,
		"/":                     false, // just below '0'
		":":                     false, // just above '9'
		"@":                     false, // just below 'A'
		"[":                     false, // just above 'Z'
		"`":                     false, // just below 'a'
		"{":                     false, // just above 'z'
	} {
		if err := Check(name, 63); (err == nil) != ok {
			t.Errorf("Check(%q) = %v, want ok=%v", name, err, ok)
		}
	}
	for _, first := range "0123456789" {
		if Check(string(first)+"x", 63) == nil {
			t.Errorf("Check(%q) accepted a leading digit", string(first)+"x")
		}
	}
	for _, c := range "09azAZ_" {
		if err := Check("x"+string(c), 63); err != nil {
			t.Errorf("Check(%q) = %v", "x"+string(c), err)
		}
	}
}
