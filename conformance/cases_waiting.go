package conformance

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
)

// mustNotRun is an fn for callers that must get a replay.
func mustNotRun[Tx any](Tx) (idempotency.Response, error) {
	return idempotency.Response{}, errors.New("conformance: fn must not run: the key is held and then completed")
}

// oneStoreWaiterPerKey: 20 callers of one Guard on a key held elsewhere
// wait in memory behind one of them; only that one waits in the store.
func (s *suite[Tx]) oneStoreWaiterPerKey(t *testing.T) {
	e := s.setup(t, Options{})
	key := idempotency.Key{ID: uniq("k")}
	// The holder is on a Guard of its own: the callers must wait in the store.
	release, done := e.hold(e.guard(nil), key, "payment")
	spy := newSpy(e.f.Store)
	spy.waitStarted = make(chan struct{}, 1)
	g := e.guardOn(spy, nil)
	out := make(chan result, Callers)
	for range Callers {
		go func() {
			r, err := g.Do(e.ctx, key, "fp", mustNotRun[Tx])
			out <- result{r, err}
		}()
	}
	select {
	case <-spy.waitStarted:
	case <-time.After(10 * time.Second):
		t.Fatal("no caller waited in the store for the held key within 10s")
	}
	time.Sleep(200 * time.Millisecond) // let the others pile up
	release()
	h := <-done
	if h.err != nil {
		t.Fatalf("holder: %v", h.err)
	}
	rs := make([]result, 0, Callers)
	within(t, 20*time.Second, "the callers waiting for the holder", func() {
		for range Callers {
			rs = append(rs, <-out)
		}
	})
	for i, r := range rs {
		if r.err != nil || !r.resp.Replayed || !sameResponse(r.resp, h.resp) {
			t.Fatalf("caller %d: got %+v, %v; want the holder's answer replayed", i, r.resp, r.err)
		}
	}
	if perKey, _ := spy.maxes(); perKey > 1 {
		t.Fatalf("%d callers of one key in one Guard were in the store at once, want 1 (the others wait in memory)", perKey)
	}
	e.count("payment", 1, "callers waiting for a holder")
}

// maxWaiters: with keys held elsewhere, at most Config.MaxWaiters calls of
// a Guard wait in the store; the others get ErrInProgress at once.
func (s *suite[Tx]) maxWaiters(t *testing.T) {
	if s.h.Features.SerialWriters {
		t.Skip("Features.SerialWriters: the store cannot hold several keys at once")
	}
	const keys, bound = 5, 2
	e := s.setup(t, Options{})
	hg := e.guard(nil)
	ks := make([]idempotency.Key, keys)
	releases := make([]func(), keys)
	dones := make([]<-chan result, keys)
	for i := range ks {
		ks[i] = idempotency.Key{ID: uniq(fmt.Sprint("held", i))}
		releases[i], dones[i] = e.hold(hg, ks[i], "held")
	}
	spy := newSpy(e.f.Store)
	g := e.guardOn(spy, &idempotency.Config{MaxWaiters: bound})
	type keyed struct {
		i int
		result
	}
	out := make(chan keyed, keys)
	for i := range ks {
		go func() {
			r, err := g.Do(e.ctx, ks[i], "fp", mustNotRun[Tx])
			out <- keyed{i, result{r, err}}
		}()
	}
	refused := map[int]bool{}
	within(t, 15*time.Second, "the callers beyond MaxWaiters", func() {
		for range keys - bound {
			r := <-out
			if !errors.Is(r.err, idempotency.ErrInProgress) {
				t.Errorf("caller of held key %d while %d others wait: got %+v, %v; want ErrInProgress at once", r.i, bound, r.resp, r.err)
			}
			refused[r.i] = true
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	select {
	case r := <-out:
		t.Fatalf("caller of held key %d returned %+v, %v while its key was held; want %d callers waiting", r.i, r.resp, r.err, bound)
	case <-time.After(200 * time.Millisecond):
	}
	for i := range releases {
		releases[i]()
		if h := <-dones[i]; h.err != nil {
			t.Fatalf("holder %d: %v", i, h.err)
		}
	}
	within(t, 20*time.Second, "the callers waiting in the store", func() {
		for range bound {
			r := <-out
			if refused[r.i] || r.err != nil || !r.resp.Replayed {
				t.Errorf("waiting caller of key %d: got %+v, %v; want the holder's answer replayed", r.i, r.resp, r.err)
			}
		}
	})
	if _, waiting := spy.maxes(); waiting > bound {
		t.Fatalf("%d calls waited in the store at once, want at most MaxWaiters = %d", waiting, bound)
	}
	e.count("held", keys, "holders")
}
