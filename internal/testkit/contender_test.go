package testkit

import (
	"context"
	"flag"
	"sync"
	"testing"
	"time"
)

// memContender is an in-memory contender: a map of keys under a mutex, and
// an effect counter. With dup set, it runs the effect again on a replay;
// with racy set, it checks the key, then sleeps, then takes it ("check then
// write"), so that concurrent callers of one key all run the effect.
type memContender struct {
	mu      sync.Mutex
	keys    map[string]bool
	effects int
	dup     bool
	racy    bool
}

func (m *memContender) contender() Contender {
	return Contender{
		Do: func(_ context.Context, key string) (bool, error) {
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.racy && !m.keys[key] {
				m.mu.Unlock()
				time.Sleep(20 * time.Millisecond) // the other callers check meanwhile
				m.mu.Lock()
				m.keys[key] = true
				m.effects++
				return false, nil
			}
			if m.keys[key] {
				if m.dup {
					m.effects++
				}
				return true, nil
			}
			m.keys[key] = true
			m.effects++
			return false, nil
		},
		Effects: func(context.Context) (int, error) {
			m.mu.Lock()
			defer m.mu.Unlock()
			return m.effects, nil
		},
	}
}

// TestBenchmarkContender runs BenchmarkContender on a correct contender and
// on two that duplicate effects (on replays; with concurrent callers of one
// key): those must fail, not be measured.
func TestBenchmarkContender(t *testing.T) {
	bt := flag.Lookup("test.benchtime")
	old := bt.Value.String()
	if err := bt.Value.Set("20x"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bt.Value.Set(old) })

	for _, c := range []struct {
		dup, racy bool
		wantFail  bool
	}{{false, false, false}, {true, false, true}, {false, true, true}} {
		m := &memContender{keys: map[string]bool{}, dup: c.dup, racy: c.racy}
		var failed bool
		testing.Benchmark(func(b *testing.B) {
			BenchmarkContender(b, m.contender())
			failed = b.Failed()
		})
		if failed != c.wantFail {
			t.Errorf("dup=%v racy=%v: failed=%v, want %v", c.dup, c.racy, failed, c.wantFail)
		}
		if c.wantFail {
			continue
		}
		if m.effects != len(m.keys) {
			t.Errorf("%d effects for %d keys", m.effects, len(m.keys))
		}
		if len(m.keys) < 1+1+20 {
			t.Errorf("%d keys: not every case ran", len(m.keys))
		}
	}
}
