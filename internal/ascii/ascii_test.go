package ascii

import "testing"

func TestIndexNotPrintable(t *testing.T) {
	for s, want := range map[string]int{
		"": -1, " ~": -1, "order-42": -1, "a\x1fb": 1, "\x7f": 0, "ab\xff": 2, "é": 0,
	} {
		if got := IndexNotPrintable(s); got != want {
			t.Errorf("IndexNotPrintable(%q) = %d, want %d", s, got, want)
		}
	}
}
