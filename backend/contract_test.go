package backend

import (
	"slices"
	"testing"
)

func TestMissingColumns(t *testing.T) {
	want := []string{"id", "scope", "progress", "tries"}
	for _, c := range []struct {
		have, missing []string
	}{
		{nil, want},
		{[]string{"ID", "Scope", "progress", "tries", "extra"}, nil},
		{[]string{"id", "scope"}, []string{"progress", "tries"}},
		{[]string{"tries", "id"}, []string{"scope", "progress"}},
	} {
		if got := MissingColumns(c.have, want); !slices.Equal(got, c.missing) {
			t.Errorf("MissingColumns(%q) = %q, want %q", c.have, got, c.missing)
		}
	}
}
