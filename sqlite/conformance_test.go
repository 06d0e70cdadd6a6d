package sqlite_test

import (
	"bytes"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

func TestConformance(t *testing.T) { conformance.Run(t, harness()) }

func harness() conformance.Harness[*sql.Tx] {
	return conformance.Harness[*sql.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*sql.Tx] {
			return openFixture(t, opts.MaxConns).clocked(t, opts.Clock).conformance()
		},
		Features: conformance.Features{SerialWriters: true},
	}
}

// BenchmarkStore compares Do with the bare effect transaction on a
// database opened with [sqlite.Open]; see conformance.Benchmark and
// cmd/idembench.
func BenchmarkStore(b *testing.B) { conformance.Benchmark(b, harness()) }

// BenchmarkScale runs Do against 1M existing keys and Purge of 1M expired
// keys under load; see conformance.BenchmarkScale.
func BenchmarkScale(b *testing.B) { conformance.BenchmarkScale(b, harness()) }

// TestConformanceBareDSN runs the suite on databases opened without any DSN
// option (rollback journal, no busy timeout, deferred transactions), as a
// user may open them.
func TestConformanceBareDSN(t *testing.T) {
	conformance.Run(t, conformance.Harness[*sql.Tx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*sql.Tx] {
			return newFixture(t, openBare(t, filepath.Join(t.TempDir(), "bare.db")), opts.MaxConns).clocked(t, opts.Clock).conformance()
		},
		Features: conformance.Features{SerialWriters: true},
	})
}

// TestConcurrentSameKeyBareDSN is the hard case of SQLite: on a database
// opened without any DSN option (no busy timeout, rollback journal, deferred
// transactions) 20 concurrent callers of one key fail with SQLITE_BUSY
// unless the store makes them wait. Every caller must succeed: one executes,
// 19 replay, one effect commits.
func TestConcurrentSameKeyBareDSN(t *testing.T) {
	for _, c := range []struct{ name, opts string }{
		{"NoOptions", ""},
		{"WALDeferred", "?_pragma=journal_mode(WAL)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := testkit.Context(t, testTimeout)
			f := newFixture(t, openBare(t, filepath.Join(t.TempDir(), "bare.db")+c.opts), 0)
			g, err := idempotency.New(f.store, nil)
			if err != nil {
				t.Fatal(err)
			}
			key := idempotency.Key{ID: testkit.Name("k_")}
			const n = 20
			type result struct {
				resp idempotency.Response
				err  error
			}
			rs := make([]result, n)
			testkit.Together(n, func(i int) {
				rs[i].resp, rs[i].err = g.Do(ctx, key, "fp", func(tx *sql.Tx) (idempotency.Response, error) {
					if err := f.fx.Effect(ctx, tx, "payment"); err != nil {
						return idempotency.Response{}, err
					}
					time.Sleep(20 * time.Millisecond) // let the others pile up
					return idempotency.Response{Status: 201, Body: []byte(fmt.Sprint("caller ", i))}, nil
				})
			})
			executed := 0
			for i, r := range rs {
				if r.err != nil {
					t.Fatalf("caller %d: %v; want every caller to succeed", i, r.err)
				}
				if !r.resp.Replayed {
					executed++
				}
				if !bytes.Equal(r.resp.Body, rs[0].resp.Body) {
					t.Fatalf("caller %d got %q, caller 0 got %q: want one response", i, r.resp.Body, rs[0].resp.Body)
				}
			}
			if executed != 1 {
				t.Fatalf("executed: got %d, want 1", executed)
			}
			if got, err := f.fx.Count(ctx, "payment"); err != nil || got != 1 {
				t.Fatalf("effects: got %d, %v; want 1", got, err)
			}
			// The store restored the DSN's busy timeout (0) on the pool's
			// connections.
			var bt int
			if err := f.db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&bt); err != nil || bt != 0 {
				t.Fatalf("busy_timeout after the calls: got %d, %v; want the DSN's 0", bt, err)
			}
		})
	}
}
