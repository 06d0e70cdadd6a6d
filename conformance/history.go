package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/conformance/faultproxy"
)

// Outcomes of a recorded call ([HistoryCall].Outcome).
const (
	// OutcomeOK: the call returned an answer (executed or replayed).
	OutcomeOK = "ok"
	// OutcomeInProgress: the call returned [idempotency.ErrInProgress];
	// nothing was applied by it.
	OutcomeInProgress = "in-progress"
	// OutcomeFailed: fn returned its own error; the call applied nothing.
	OutcomeFailed = "failed"
	// OutcomeMismatch: the call returned [idempotency.ErrMismatch]. Every
	// call of a history has the same fingerprint, so this is never right.
	OutcomeMismatch = "mismatch"
	// OutcomeUnknown: the caller died, its reply was lost, or the store
	// failed: the call may or may not have applied.
	OutcomeUnknown = "unknown"
)

// History is one recorded run of concurrent calls of [idempotency.Guard.Do]
// on a few keys, with faults: what each call was asked and what it got, and
// the effects committed per key in the end. It is plain data (it marshals
// to JSON): a checker of its own judges it against the sequential rules of
// a key (internal/historycheck does so with porcupine).
type History struct {
	// Store names the store the history ran on.
	Store string `json:"store"`
	// Number is the history's number: with the same number, the same plan
	// (keys, calls, faults) is drawn; the interleaving is the machine's.
	Number uint64 `json:"number"`
	// Fault is the network fault armed for the history, "" if none.
	Fault string `json:"fault,omitempty"`
	// Calls are the calls, in no particular order; the last call of each
	// key is a probe made after every other call ended.
	Calls []HistoryCall `json:"calls"`
	// Effects is how many effects were committed per key ID, counted on
	// the server once every call ended.
	Effects map[string]int `json:"effects"`
	// Ended is when the last call (probes aside) returned, in nanoseconds
	// since the history's start: a call whose outcome is unknown took
	// effect, if it did, before it.
	Ended int64 `json:"ended"`
}

// HistoryCall is one call of a [History].
type HistoryCall struct {
	// Client is the caller that made it; a caller makes its calls one
	// after another.
	Client int `json:"client"`
	// Key is the key's ID.
	Key string `json:"key"`
	// Would is the body fn answers when this call runs it: unique to the
	// call, so that an answer names the call that produced it.
	Would []byte `json:"would"`
	// Call is when the call started, in nanoseconds since the history's
	// start; Return when it returned, or -1 when its outcome is unknown
	// (it may take effect at any time after Call).
	Call   int64 `json:"call"`
	Return int64 `json:"return"`
	// Outcome is one of the Outcome constants.
	Outcome string `json:"outcome"`
	// Status and Body are the answer of an OutcomeOK call; Replayed says
	// whether it was read back from the store.
	Status   int    `json:"status,omitempty"`
	Body     []byte `json:"body,omitempty"`
	Replayed bool   `json:"replayed,omitempty"`
	// ErrKind says what the call returned when it failed: "ErrStore",
	// "deadline", "lost-reply", "fn" and so on.
	ErrKind string `json:"err_kind,omitempty"`
	// Probe marks the call made after all others to read the key's final
	// answer: its fn fails, so it applies nothing.
	Probe bool `json:"probe,omitempty"`
}

// HistoryRig records histories ([History]) on one store: concurrent calls
// of Do on a few keys, through two Guards, with the faults a caller meets.
// Each call may be cut short by its context (the caller dies), have its
// reply thrown away (the reply was lost), run a slow fn or one that fails;
// with a Proxy, one network fault of [faultproxy] (a cut connection, a
// dropped reply, a delayed step) is also armed at a step drawn for the
// history. Histories use keys of their own, so one rig records many.
//
// A rig records one history at a time; run several rigs (each with its own
// proxy) to record in parallel.
type HistoryRig[Tx any] struct {
	// Store names the store in the histories.
	Store string
	// Faulty is the fixture the calls run on: its store dials Proxy, if
	// any. Its Effect is the calls' effect.
	Faulty Fixture[Tx]
	// Clean is a fixture on the server directly, with the same keys and
	// effects: the probes run on it, and its Count counts the effects.
	Clean Fixture[Tx]
	// Proxy, if not nil, is the fault proxy Faulty's connections go
	// through.
	Proxy *faultproxy.Proxy
	// Keys, Clients and Calls shape a history: Clients callers, each making
	// Calls calls on keys drawn from Keys. Default 2, 4 and 3.
	Keys, Clients, Calls int
	// CallTimeout bounds each call's context; WaitTimeout is the Guards'
	// wait bound. Defaults 600ms and 150ms.
	CallTimeout, WaitTimeout time.Duration
	// Settle bounds how long the probes wait for a key still held (a lease
	// or a session the server has not ended yet). Default 10s.
	Settle time.Duration
	// OnCall, if not nil, is told each call as it starts (done false, with
	// no outcome) and as it returns (done true): a process that records
	// for another, which may kill it, streams its calls with it.
	OnCall func(c HistoryCall, done bool)

	once   sync.Once
	run    string
	steps  atomic.Int64
	guards [2]*idempotency.Guard[Tx]
	probe  *idempotency.Guard[Tx]
	err    error
}

// CountStep counts a step of Proxy; pass it as [faultproxy.Config].OnStep
// (or call it from yours) so that the rig can arm a fault a number of steps
// ahead.
func (r *HistoryRig[Tx]) CountStep(faultproxy.Step) { r.steps.Add(1) }

func (r *HistoryRig[Tx]) init() error {
	r.once.Do(func() {
		r.Keys = cmpOr(r.Keys, 2)
		r.Clients = cmpOr(r.Clients, 4)
		r.Calls = cmpOr(r.Calls, 3)
		r.CallTimeout = cmpOr(r.CallTimeout, 600*time.Millisecond)
		r.WaitTimeout = cmpOr(r.WaitTimeout, 150*time.Millisecond)
		r.Settle = cmpOr(r.Settle, 10*time.Second)
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		r.run = hex.EncodeToString(b)
		if r.Faulty.Store == nil || r.Faulty.Effect == nil || r.Clean.Store == nil || r.Clean.Count == nil {
			r.err = errors.New("conformance: HistoryRig needs Faulty.Store, Faulty.Effect, Clean.Store and Clean.Count")
			return
		}
		for i := range r.guards {
			if r.guards[i], r.err = idempotency.New(r.Faulty.Store, &idempotency.Config{WaitTimeout: r.WaitTimeout, TTL: historyTTL}); r.err != nil {
				return
			}
		}
		r.probe, r.err = idempotency.New(r.Clean.Store, &idempotency.Config{WaitTimeout: -1, TTL: historyTTL})
	})
	return r.err
}

// historyTTL is how long the keys of a history are remembered: long
// enough for its probes, short enough that a run leaves nothing behind
// for long on a shared server.
const historyTTL = 5 * time.Minute

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// What a call of a history does besides its call of Do.
const (
	modePlain    = iota
	modeDies     // its context ends after a few milliseconds: the caller died
	modeFnFails  // fn fails: nothing applies
	modeSlow     // fn takes a few tens of milliseconds
	modeLost     // the reply is thrown away: the caller never learns it
	modeSlowFail // fn takes a while, then fails
)

// plannedCall is a call as the history's number draws it.
type plannedCall struct {
	key   int
	mode  int
	pause time.Duration // before the call
	dies  time.Duration // modeDies: the context's life
	slow  time.Duration // modeSlow, modeSlowFail: fn's time
}

// errHistoryFn is what fn returns in the calls whose fn fails.
var errHistoryFn = errors.New("conformance: history fn fails on purpose")

// errHistoryProbe is what a probe's fn returns: the key was free.
var errHistoryProbe = errors.New("conformance: probe found the key free")

// Record runs history number n and returns it. It fails only when the rig
// itself cannot work (a bad fixture, a probe that never got an answer or a
// definite absence within Settle, a count that failed); what the calls got
// is data, for the checker to judge.
func (r *HistoryRig[Tx]) Record(ctx context.Context, n uint64) (History, error) {
	if err := r.init(); err != nil {
		return History{}, err
	}
	rng := mrand.New(mrand.NewPCG(n, 0x6869737479))
	h := History{Store: r.Store, Number: n, Effects: map[string]int{}}
	keys := make([]idempotency.Key, r.Keys)
	for i := range keys {
		keys[i] = idempotency.Key{Scope: "history", ID: fmt.Sprintf("%s-%d-k%d", r.run, n, i)}
	}
	plans := make([][]plannedCall, r.Clients)
	for c := range plans {
		for range r.Calls {
			p := plannedCall{key: rng.IntN(r.Keys), pause: time.Duration(rng.IntN(5)) * time.Millisecond}
			switch x := rng.IntN(20); {
			case x < 8:
				p.mode = modePlain
			case x < 11:
				p.mode, p.dies = modeDies, time.Duration(rng.IntN(15000))*time.Microsecond
			case x < 13:
				p.mode = modeFnFails
			case x < 16:
				p.mode, p.slow = modeSlow, time.Duration(5+rng.IntN(40))*time.Millisecond
			case x < 18:
				p.mode = modeLost
			default:
				p.mode, p.slow = modeSlowFail, time.Duration(5+rng.IntN(30))*time.Millisecond
			}
			plans[c] = append(plans[c], p)
		}
	}
	if r.Proxy != nil && rng.IntN(10) < 7 {
		actions := []faultproxy.Action{faultproxy.CutBefore, faultproxy.CutAfter, faultproxy.DropReply, faultproxy.Delay}
		a := actions[rng.IntN(len(actions))]
		at := r.steps.Load() + 1 + int64(rng.IntN(3*r.Clients*r.Calls))
		h.Fault = fmt.Sprintf("%s at step +%d", a, at-r.steps.Load())
		if _, err := r.Proxy.Arm(faultproxy.Fault{Action: a, Delay: 50 * time.Millisecond, Hold: time.Second,
			Match: func(faultproxy.Step) bool { return r.steps.Load() >= at }}); err != nil {
			return h, err
		}
		defer func() { r.Proxy.Disarm(); r.Proxy.Heal() }()
	}

	start := time.Now()
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for c, plan := range plans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := r.guards[c%2]
			for i, p := range plan {
				if historySleep(ctx, p.pause) != nil {
					return
				}
				hc := r.call(ctx, g, start, c, i, keys[p.key], p)
				mu.Lock()
				h.Calls = append(h.Calls, hc)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	h.Ended = int64(time.Since(start))
	if r.Proxy != nil {
		r.Proxy.Disarm()
		r.Proxy.Heal()
	}
	for _, k := range keys {
		pc, err := r.probeKey(ctx, start, k)
		if err != nil {
			return h, err
		}
		h.Calls = append(h.Calls, pc)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cnt, err := r.Clean.Count(cctx, k.ID)
		cancel()
		if err != nil {
			return h, fmt.Errorf("conformance: history %d: count the effects of %v: %w", n, k, err)
		}
		h.Effects[k.ID] = cnt
	}
	return h, ctx.Err()
}

// call makes call i of client c and records it.
func (r *HistoryRig[Tx]) call(ctx context.Context, g *idempotency.Guard[Tx], start time.Time, c, i int, key idempotency.Key, p plannedCall) HistoryCall {
	would := []byte(fmt.Sprintf(`{"key":%q,"call":"c%d.%d"}`, key.ID, c, i))
	hc := HistoryCall{Client: c, Key: key.ID, Would: would}
	life := r.CallTimeout
	if p.mode == modeDies {
		life = p.dies
	}
	cctx, cancel := context.WithTimeout(ctx, life)
	defer cancel()
	fn := func(tx Tx) (idempotency.Response, error) {
		if p.slow > 0 && historySleep(cctx, p.slow) != nil {
			return idempotency.Response{}, cctx.Err()
		}
		if p.mode == modeFnFails || p.mode == modeSlowFail {
			return idempotency.Response{}, errHistoryFn
		}
		if err := r.Faulty.Effect(cctx, tx, key.ID); err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: http.StatusCreated, Body: would}, nil
	}
	hc.Call = int64(time.Since(start))
	if r.OnCall != nil {
		r.OnCall(hc, false)
	}
	resp, err := g.Do(cctx, key, "fp", fn)
	hc.Return = int64(time.Since(start))
	if p.mode == modeLost {
		hc.Outcome, hc.ErrKind, hc.Return = OutcomeUnknown, "lost-reply", -1
	} else {
		r.classify(&hc, resp, err)
	}
	if r.OnCall != nil {
		r.OnCall(hc, true)
	}
	return hc
}

// classify fills the outcome of a call that returned resp, err.
func (r *HistoryRig[Tx]) classify(hc *HistoryCall, resp idempotency.Response, err error) {
	switch {
	case err == nil:
		hc.Outcome, hc.Status, hc.Body, hc.Replayed = OutcomeOK, resp.Status, resp.Body, resp.Replayed
	case errors.Is(err, idempotency.ErrInProgress):
		hc.Outcome, hc.ErrKind = OutcomeInProgress, "ErrInProgress"
	case errors.Is(err, idempotency.ErrMismatch):
		hc.Outcome, hc.ErrKind = OutcomeMismatch, "ErrMismatch"
	case (errors.Is(err, errHistoryFn) || errors.Is(err, errHistoryProbe)) && !errors.Is(err, idempotency.ErrStore):
		// fn's own error, as fn returned it: rolled back, nothing applied.
		hc.Outcome, hc.ErrKind = OutcomeFailed, "fn"
	default:
		hc.Outcome, hc.Return = OutcomeUnknown, -1
		switch {
		case errors.Is(err, idempotency.ErrStore):
			hc.ErrKind = "ErrStore"
		case errors.Is(err, context.DeadlineExceeded):
			hc.ErrKind = "deadline"
		case errors.Is(err, backend.ErrLeaseLost):
			hc.ErrKind = "ErrLeaseLost"
		default:
			hc.ErrKind = "other: " + err.Error()
		}
	}
}

// probeKey reads key's final answer on the clean store once every call
// ended: a call whose fn fails, retried while the key is held (a lease, a
// session the server has not ended yet) up to Settle.
func (r *HistoryRig[Tx]) probeKey(ctx context.Context, start time.Time, key idempotency.Key) (HistoryCall, error) {
	giveUp := time.Now().Add(r.Settle)
	var last error
	for {
		hc := HistoryCall{Client: r.Clients, Key: key.ID, Probe: true, Would: []byte("probe")}
		hc.Call = int64(time.Since(start))
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := r.probe.Do(cctx, key, "fp", func(Tx) (idempotency.Response, error) { return idempotency.Response{}, errHistoryProbe })
		cancel()
		hc.Return = int64(time.Since(start))
		r.classify(&hc, resp, err)
		if hc.Outcome == OutcomeOK || hc.Outcome == OutcomeFailed || hc.Outcome == OutcomeMismatch {
			return hc, nil
		}
		last = err
		if ctx.Err() != nil || time.Now().After(giveUp) {
			return hc, fmt.Errorf("conformance: the probe of %v got no answer within %v: %w", key, r.Settle, last)
		}
		if historySleep(ctx, 20*time.Millisecond) != nil {
			return hc, ctx.Err()
		}
	}
}

// historySleep waits d, or until ctx ends.
func historySleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
