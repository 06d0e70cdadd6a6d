package benchkit

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestLatenciesPercentile(t *testing.T) {
	var l Latencies
	if got := l.Percentile(50); got != 0 {
		t.Fatalf("empty: got %v, want 0", got)
	}
	for i := 1; i <= 100; i++ {
		l.Add(time.Duration(i) * time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 50 * time.Millisecond}, {99, 99 * time.Millisecond}, {100, 100 * time.Millisecond}, {0.1, time.Millisecond}} {
		if got := l.Percentile(c.p); got != c.want {
			t.Errorf("p%v: got %v, want %v", c.p, got, c.want)
		}
	}
}

func TestSameKey(t *testing.T) {
	var n atomic.Int64
	once := func() (bool, error) { return n.Add(1) != 1, nil }
	if err := SameKey(20, once); err != nil {
		t.Fatalf("one effect: got %v, want nil", err)
	}
	if err := SameKey(20, func() (bool, error) { return false, nil }); err == nil {
		t.Fatal("20 effects: got nil, want an error")
	}
	boom := errors.New("boom")
	if err := SameKey(20, func() (bool, error) { return false, boom }); !errors.Is(err, boom) {
		t.Fatalf("failing calls: got %v, want %v", err, boom)
	}
}

func TestPrefix(t *testing.T) {
	a, b := Prefix(), Prefix()
	if a == b || len(a) != 10 || a[0] != 'b' || a[9] != '-' {
		t.Fatalf("prefixes %q and %q", a, b)
	}
}
