package main

import "testing"

// TestLimits: the root package's page, its store contract (KeyStore)
// excluded, and idemhttp's stay short enough for a new user to read.
func TestLimits(t *testing.T) {
	for _, c := range []struct {
		dir     string
		exclude []string
		max     int
	}{
		{"../..", []string{"KeyStore"}, 80},
		{"../../idemhttp", nil, 45},
	} {
		names, err := Surface(c.dir, c.exclude...)
		if err != nil {
			t.Fatal(err)
		}
		if n, im := Count(names); n > c.max {
			t.Errorf("%s exports %d identifiers (and %d methods of its interfaces), more than %d:\n%q", c.dir, n, im, c.max, names)
		} else {
			t.Logf("%s: %d identifiers (and %d methods of its interfaces), at most %d", c.dir, n, im, c.max)
		}
	}
}

// TestSurfaceCounts: the counting rules on a package of known shape.
func TestSurfaceCounts(t *testing.T) {
	names, err := Surface("testdata/shape")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"A", "B", "C", "I", "I.M()", "T", "T.Get", "T.String", "X", "Y"}
	if len(names) != len(want) {
		t.Fatalf("names %q, want %q", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("names %q, want %q", names, want)
		}
	}
	if n, im := Count(names); n != 9 || im != 1 {
		t.Fatalf("Count = %d, %d; want 9, 1", n, im)
	}
}
