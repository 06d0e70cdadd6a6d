package idemhttp_test

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// BenchmarkUnrelatedLatency measures the pool starvation by waiters on PostgreSQL, over real
// HTTP, with a pool of 4 connections: the latency of unrelated traffic (an
// unguarded route that queries the same pool, and another tenant's new
// key) while one slow key is held, with 50 waiters of that key and without
// them, in the same run. Each iteration is one round of both modes, in
// alternating order; each mode sends 10 requests to the unguarded route
// and 2 new keys of another tenant, one after the other, while the slow
// key is held. It reports, per mode, the median and the range (min, max)
// in milliseconds, and the ratio of the medians (with / without):
//
//	go test -run '^$' -bench UnrelatedLatency -benchtime 20x ./idemhttp/
//
// HeldHere: the slow key runs in the same service (its waiters wait in
// memory). HeldElsewhere: it runs in another process on the same tables
// (one waiter waits inside the database).
func BenchmarkUnrelatedLatency(b *testing.B) {
	for _, where := range []string{"HeldHere", "HeldElsewhere"} {
		b.Run(where, func(b *testing.B) {
			d := newPoolDB(b)
			hs := &holds{}
			cfg := &idempotency.Config{WaitTimeout: 2 * time.Minute}
			a := newPoolService(b, d, poolSize, cfg, hs)
			holder := a
			if where == "HeldElsewhere" {
				holder = newPoolService(b, d, poolSize, cfg, hs)
			}
			hc := newClient(b)
			var lat [2]latencies // 0: without the waiters, 1: with them
			round := 0
			for b.Loop() {
				modes := []int{0, 1}
				if round%2 == 1 {
					modes = []int{1, 0}
				}
				for _, m := range modes {
					lat[m].round(b, hc, a, holder, hs, m == 1, fmt.Sprintf("r%d-%d", round, m))
				}
				round++
			}
			report(b, "route", lat[0].route, lat[1].route)
			report(b, "tenant", lat[0].tenant, lat[1].tenant)
		})
	}
}

// latencies are the unrelated requests' latencies of one mode.
type latencies struct{ route, tenant []time.Duration }

// round holds a slow key on holder, sends 50 waiters of it to a if
// waiters, measures the unrelated traffic of a while the key is held, then
// releases the key and checks every answer.
func (l *latencies) round(b *testing.B, hc *http.Client, a, holder *poolService, hs *holds, waiters bool, key string) {
	const n = 50
	h := hs.add("A/" + key)
	defer h.free()
	first := launch(hc, 1, holder.url+"/pay", "A", key, time.Minute)
	h.await(b)
	var ws <-chan []reply
	if waiters {
		base := int64(0)
		if holder == a {
			base = 1
		}
		ws = launch(hc, n, a.url+"/pay", "A", key, time.Minute)
		testkit.WaitUntil(b, 30*time.Second, "the waiters to be in flight", func() bool { return a.inflight.Load() == base+n })
	}
	for range 10 {
		r := call(hc, http.MethodGet, a.url+"/unguarded", "", "", 30*time.Second)
		if r.err != nil || r.status != http.StatusOK {
			b.Fatalf("unguarded route: %d %q %v", r.status, r.body, r.err)
		}
		l.route = append(l.route, r.took)
	}
	for i := range 2 {
		r := call(hc, http.MethodPost, a.url+"/pay", "B", fmt.Sprintf("%s-b%d", key, i), 30*time.Second)
		if r.err != nil || r.status != http.StatusCreated {
			b.Fatalf("another tenant's key: %d %q %v", r.status, r.body, r.err)
		}
		l.tenant = append(l.tenant, r.took)
	}
	select {
	case <-first:
		b.Fatal("the slow key was answered before its release")
	default:
	}
	h.free()
	if r := (<-first)[0]; r.status != http.StatusCreated {
		b.Fatalf("slow key: %d %q %v", r.status, r.body, r.err)
	}
	if waiters {
		for _, r := range <-ws {
			if r.status != http.StatusCreated {
				b.Fatalf("waiter: %d %q %v", r.status, r.body, r.err)
			}
		}
	}
}

// report adds the median and range of both modes, in milliseconds, and the
// ratio of the medians.
func report(b *testing.B, name string, without, with []time.Duration) {
	if len(without) == 0 || len(with) == 0 {
		return
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	med := func(s []time.Duration) time.Duration { s = slices.Clone(s); slices.Sort(s); return s[len(s)/2] }
	b.ReportMetric(ms(med(without)), name+"-p50-ms")
	b.ReportMetric(ms(slices.Min(without)), name+"-min-ms")
	b.ReportMetric(ms(slices.Max(without)), name+"-max-ms")
	b.ReportMetric(ms(med(with)), name+"-waiters-p50-ms")
	b.ReportMetric(ms(slices.Min(with)), name+"-waiters-min-ms")
	b.ReportMetric(ms(slices.Max(with)), name+"-waiters-max-ms")
	b.ReportMetric(float64(med(with))/float64(med(without)), name+"-p50-ratio")
}
