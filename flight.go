package idempotency

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"
)

// flight is the in-memory queue of a [Guard]: the call of each key that is
// in the store, and the slots for waiting inside the store. A Guard and
// every view of it ([Guard.WithTTL]) share one, so their callers of one key
// meet in memory.
type flight struct {
	mu    sync.Mutex
	calls map[Key]*call // the call of each key that is in the store
	// waiters has one slot per call allowed to wait inside the store; nil
	// means no bound.
	waiters chan struct{}
}

// call is the one call of a key that is in the store on behalf of every
// caller of that key in a Guard. The others wait for it in memory.
type call struct {
	done chan struct{} // closed when the call is over; then ans is set
	ran  chan struct{} // closed when the call won the key and runs fn
	once sync.Once
	ans  *answer // nil: the call failed, waiters compete again
	// followers counts the callers that joined the call to wait for it
	// (under flight.mu): with none, its answer is not copied for them.
	followers int
}

// answer is a committed answer handed to the waiters of a call.
type answer struct {
	fp   string   // fingerprint the record was stored with
	resp Response // private copy; cloned again for each waiter
}

func (c *call) running() { c.once.Do(func() { close(c.ran) }) }

// won reports whether an attempt of the call has won the key (fn ran).
func (c *call) won() bool {
	select {
	case <-c.ran:
		return true
	default:
		return false
	}
}

// join returns the call of key in the store and whether the caller must
// make it (lead) or wait for it.
func (g *Guard[Tx]) join(key Key) (c *call, lead bool) {
	f := g.fl
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.calls[key]; ok {
		c.followers++
		return c, false
	}
	c = &call{done: make(chan struct{}), ran: make(chan struct{})}
	f.calls[key] = c
	return c, true
}

// leave ends c with ans (nil if it failed) and wakes its waiters. ans.resp
// is the leader's own response: the waiters get a private copy of it, made
// only if any joined (none can join once c has left the flight).
func (g *Guard[Tx]) leave(key Key, c *call, ans *answer) {
	g.fl.mu.Lock()
	delete(g.fl.calls, key)
	followers := c.followers
	g.fl.mu.Unlock()
	if ans != nil && followers > 0 {
		ans.resp = cloneResponse(ans.resp)
	}
	c.ans = ans
	close(c.done)
}

// follow waits for the call ahead of the caller. handed is true when it
// returns that call's answer (or ErrMismatch against it); false, with no
// error, when that call failed and the caller must compete for the key.
func (g *Guard[Tx]) follow(ctx context.Context, c *call, fp string, deadline time.Time) (resp Response, handed bool, err error) {
	ran := c.ran
	if !g.noWait {
		ran = nil // only callers that do not wait give up once fn runs
	}
	if err := c.wait(ctx, ran, deadline); err != nil {
		return Response{}, false, err
	}
	if c.ans == nil {
		return Response{}, false, nil
	}
	if c.ans.fp != fp {
		return Response{}, true, ErrMismatch
	}
	resp = cloneResponse(c.ans.resp)
	resp.Replayed = true
	return resp, true, nil
}

// takeWaiter takes one of the slots for waiting inside the store, without
// blocking; false if none is free.
func (g *Guard[Tx]) takeWaiter() bool {
	if g.fl.waiters == nil {
		return true
	}
	select {
	case g.fl.waiters <- struct{}{}:
		return true
	default:
		return false
	}
}

func (g *Guard[Tx]) releaseWaiter() {
	if g.fl.waiters != nil {
		<-g.fl.waiters
	}
}

// cloneResponse returns a copy of r that shares no header map nor body
// bytes with it (a nil body stays nil).
func cloneResponse(r Response) Response {
	r.Header = r.Header.Clone()
	r.Body = bytes.Clone(r.Body)
	return r
}

// wait waits until c is over (nil), ran is closed (errRunning), deadline
// passes (errHeldAtBound) or ctx is done (ctx's error). Each waiter has its
// own timer. A call that is over already wins over every other case.
func (c *call) wait(ctx context.Context, ran <-chan struct{}, deadline time.Time) error {
	if c.over() {
		return nil // and no timer to start
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-c.done:
		return nil
	case <-ran:
		return errRunning
	case <-timer.C:
		return errHeldAtBound
	case <-ctx.Done():
		return ctx.Err()
	}
}

// over reports whether c has ended.
func (c *call) over() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

var (
	errRunning     = fmt.Errorf("%w: another caller is running fn", ErrInProgress)
	errHeldAtBound = fmt.Errorf("%w: another caller still held the key at the wait bound", ErrInProgress)
)
