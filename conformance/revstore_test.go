package conformance_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/conformance"
)

// revServer is an in-memory key-value server with etcd's semantics: every
// write gets the next revision of the whole store, each key remembers the
// revision of its last write (its mod revision), and a transaction applies
// its writes only if its compares on mod revisions hold. Each method is
// one request: atomic on its own, with the "network" between two of them,
// where other clients' requests may land.
type revServer struct {
	mu     sync.Mutex
	rev    int64
	kvs    map[idempotency.Key]*revKV
	counts map[string]int // effects applied, by tag
	wake   chan struct{}  // closed and replaced on every write (a watch)
}

type revKV struct {
	mod int64
	val revVal
}

// revVal is a key's value: a pending reservation under a lease, or a
// completed record.
type revVal struct {
	pending bool
	// leaseEnd is when the reservation's lease ends by the server's
	// clock, set by the server (as etcd counts a lease down); zero: never.
	leaseEnd time.Time
	// hostLeaseEnd is the holder's clock plus the lease, written by the
	// client: read only with the hostLease mistake.
	hostLeaseEnd time.Time
	rec          backend.Record
}

func newRevServer() *revServer {
	return &revServer{kvs: map[idempotency.Key]*revKV{}, counts: map[string]int{}, wake: make(chan struct{})}
}

// written records a write; s.mu is held.
func (s *revServer) written() int64 {
	s.rev++
	close(s.wake)
	s.wake = make(chan struct{})
	return s.rev
}

// forever is the lease left of a hold written with no lease.
const forever = time.Duration(1<<63 - 1)

// get returns key's value and mod revision (0: absent), the watch channel
// of this revision, and what is left of a pending value's lease by the
// server's clock (forever for one with no lease).
func (s *revServer) get(key idempotency.Key) (revVal, int64, <-chan struct{}, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kv := s.kvs[key]
	if kv == nil {
		return revVal{}, 0, s.wake, 0
	}
	v := kv.val
	v.rec.Header, v.rec.Body = v.rec.Header.Clone(), bytes.Clone(v.rec.Body)
	left := forever
	if !v.leaseEnd.IsZero() {
		left = time.Until(v.leaseEnd)
	}
	return v, kv.mod, s.wake, left
}

// txn writes v to key (delete if v is nil) and applies effects, if key's
// mod revision is still mod (0: absent), or always when blind. A pending v
// gets a lease of lease from now by the server's clock (none if 0). It
// returns whether it wrote, and the new mod revision.
func (s *revServer) txn(key idempotency.Key, mod int64, blind bool, v *revVal, effects []string, lease time.Duration) (bool, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := int64(0)
	if kv := s.kvs[key]; kv != nil {
		cur = kv.mod
	}
	if !blind && cur != mod {
		return false, cur
	}
	if v != nil && v.pending && lease > 0 {
		v.leaseEnd = time.Now().Add(lease)
	}
	if v == nil {
		if cur == 0 {
			return blind, 0
		}
		delete(s.kvs, key)
		s.written()
		return true, 0
	}
	rev := s.written()
	s.kvs[key] = &revKV{mod: rev, val: *v}
	for _, tag := range effects {
		s.counts[tag]++
	}
	return true, rev
}

// candidate is a key Purge chose, with the mod revision it saw.
type candidate struct {
	key idempotency.Key
	mod int64
}

// expired returns up to limit completed keys that expire at or before
// before (all of them when limit < 0).
// awaitRedone waits until one of chosen was completed again since it was
// chosen (its revision changed and it is not pending). It gives up after
// grace if none of them was reserved again meanwhile, else after limit,
// or when ctx ends.
func (s *revServer) awaitRedone(ctx context.Context, chosen []candidate, grace, limit time.Duration) {
	if len(chosen) == 0 {
		return
	}
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	redoing := false
	for {
		s.mu.Lock()
		for _, c := range chosen {
			kv := s.kvs[c.key]
			if kv == nil || kv.mod == c.mod {
				continue
			}
			if !kv.val.pending {
				s.mu.Unlock()
				return
			}
			redoing = true
		}
		s.mu.Unlock()
		if since := time.Since(start); since > limit || !redoing && since > grace {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

func (s *revServer) expired(before time.Time, limit int) []candidate {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []candidate
	for k, kv := range s.kvs {
		if limit >= 0 && len(out) >= limit {
			break
		}
		if !kv.val.pending && !kv.val.rec.ExpiresAt.After(before) {
			out = append(out, candidate{k, kv.mod})
		}
	}
	return out
}

func (s *revServer) count(tag string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[tag]
}

// mistakes are the deliberate bugs of a revStore, each a mistake a
// third-party author made writing an etcd store: the catalogue shows the
// suite failing each.
type mistakes struct {
	blindReserve       bool // a free key is taken by a read, then an unconditional write
	takeoverNoCAS      bool // a lapsed lease is taken over by an unconditional write
	staleRollback      bool // Rollback deletes the key whoever holds it now
	waiterIgnoresLease bool // a waiter wakes only on writes, not when the lease runs out
	lostAsPlain        bool // a lost lease is a plain error, not ErrLeaseLost
	noOwnerCheck       bool // Complete applies even when the lease was taken over
	purgeNoRecheck     bool // Purge deletes what its scan saw without comparing revisions
	purgeIgnoresLimit  bool // Purge deletes every expired key
	purgeCountsChosen  bool // Purge reports the keys it chose, not those it deleted
	failedHolds        bool // a failed Complete leaves the key held until its lease runs out
	purgeHeldOnly      bool // Purge's delete checks only that the key is not held, not its revision
	hostLease          bool // a hold is judged by the holder's clock plus the lease against the reader's clock
	noLeaseOnHold      bool // a hold has no lease: a waiter takes it over once it watched it for a lease
	noClockNoExpiry    bool // without a test clock, a completed record never expires
	roundDown          bool // a coarse expiry is rounded down to the granularity, not up
}

// revStore is a client of a revServer: a KeyStore holding keys by lease,
// as an etcd, DynamoDB or Consul store does. Without mistakes it is
// correct: every write that takes, completes, frees or purges a key
// compares the mod revision it read.
type revStore struct {
	srv   *revServer
	lease time.Duration
	bugs  mistakes
	// gap is the time between a read and the write that depends on it (a
	// round trip to the server): the window a racing client can use.
	gap time.Duration
	// purgeGap is the same window in Purge, between scan and delete.
	purgeGap time.Duration
	// takeoverGap is the same window for the take-over of a lapsed lease:
	// wider than gap with the takeoverNoCAS mistake, so that the callers
	// that woke when the lease ran out all read it lapsed before any of
	// them writes, even on a loaded host where they wake some ms apart.
	takeoverGap time.Duration
	// deleteGap is the round trip of each of Purge's deletes.
	deleteGap time.Duration
	// clock is the test clock (conformance.Options.Clock), or nil: the
	// server's own clock (here the process's) judges expiry.
	clock func() time.Time
	// host is the clock of the host the client runs on
	// (conformance.Fixture.ReopenAt); only the hostLease mistake reads it.
	host func() time.Time
	// granularity, when > 0, is the coarse unit of the server's expiries
	// and leases (conformance.Features.ExpiryGranularity).
	granularity time.Duration
}

// coarse rounds d to the store's granularity: up, or down with the
// roundDown mistake (never below one unit).
func (s *revStore) coarse(d time.Duration) time.Duration {
	g := s.granularity
	if g <= 0 || d%g == 0 {
		return d
	}
	if s.bugs.roundDown && d > g {
		return d - d%g
	}
	return d + g - d%g
}

// now is the clock that judges expiry: the test clock, range-checked, or
// the server's.
func (s *revStore) now() (time.Time, error) {
	if s.clock == nil {
		return time.Now(), nil
	}
	now := s.clock()
	return now, backend.CheckClock(now)
}

// revTx buffers the effects of one reservation, applied with Complete.
type revTx struct{ effects []string }

func (s *revStore) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*revTx], *backend.Record, error) {
	deadline := time.Now().Add(r.Wait)
	var watched int64 // the revision this caller watches (noLeaseOnHold)
	var watchedSince time.Time
	for {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		v, mod, watch, left := s.srv.get(r.Key)
		now, err := s.now()
		if err != nil {
			return nil, nil, err
		}
		switch {
		case s.bugs.hostLease:
			left = v.hostLeaseEnd.Sub(s.host())
		case s.bugs.noLeaseOnHold && v.pending:
			// Only a caller that waits a whole lease ever takes over.
			if mod != watched {
				watched, watchedSince = mod, time.Now()
			}
			left = forever
			if r.Wait >= s.lease {
				left = s.lease - time.Since(watchedSince)
			}
		}
		switch {
		case mod != 0 && !v.pending && v.rec.ExpiresAt.After(now):
			return nil, &v.rec, nil
		case mod == 0 || !v.pending || left <= 0:
			if mod != 0 && v.pending {
				time.Sleep(max(s.gap, s.takeoverGap))
			} else {
				time.Sleep(s.gap)
			}
			nv := &revVal{pending: true, hostLeaseEnd: s.host().Add(s.lease),
				rec: backend.Record{Key: r.Key, Fingerprint: r.Fingerprint, CreatedAt: now, ExpiresAt: backend.Expiry(now, r.TTL)}}
			lease := s.coarse(s.lease)
			if s.bugs.noLeaseOnHold {
				lease = 0
			}
			blind := (mod == 0 && s.bugs.blindReserve) || (mod != 0 && v.pending && s.bugs.takeoverNoCAS)
			if ok, rev := s.srv.txn(r.Key, mod, blind, nv, nil, lease); ok {
				return &revTxn{s: s, key: r.Key, mod: rev, fp: r.Fingerprint, created: now, ttl: r.TTL, tx: &revTx{}}, nil, nil
			}
			continue // another client wrote first: read again
		}
		if !time.Now().Before(deadline) {
			return nil, nil, fmt.Errorf("%w: rev store: key %v is held", idempotency.ErrInProgress, r.Key)
		}
		wait := time.Until(deadline)
		if !s.bugs.waiterIgnoresLease {
			wait = min(wait, left)
		}
		timer := time.NewTimer(wait)
		select {
		case <-watch:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, nil, ctx.Err()
		}
		timer.Stop()
	}
}

func (s *revStore) Purge(ctx context.Context, limit int) (int, error) {
	before, err := s.now()
	if err != nil {
		return 0, err
	}
	scan := limit
	if s.bugs.purgeIgnoresLimit {
		scan = -1
	}
	chosen := s.srv.expired(before, scan)
	time.Sleep(s.purgeGap)
	if s.bugs.purgeNoRecheck || s.bugs.purgeHeldOnly {
		// These mistakes show only when a chosen record is done again
		// before its delete. Once one is reserved again, wait for it to
		// complete, so that the catalogue catches them however slow the
		// machine, not by timing.
		s.srv.awaitRedone(ctx, chosen, 300*time.Millisecond, 5*time.Second)
	}
	n := 0
	for _, c := range chosen {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		time.Sleep(s.deleteGap)
		mod, blind := c.mod, s.bugs.purgeNoRecheck
		if s.bugs.purgeHeldOnly { // compares only that the key is not held
			v, cur, _, _ := s.srv.get(c.key)
			if cur == 0 || v.pending {
				continue
			}
			mod = cur
		}
		if ok, _ := s.srv.txn(c.key, mod, blind, nil, nil, 0); ok {
			n++
		}
	}
	if s.bugs.purgeCountsChosen {
		return len(chosen), nil
	}
	return n, nil
}

type revTxn struct {
	s       *revStore
	key     idempotency.Key
	mod     int64 // the mod revision of our reservation
	fp      string
	created time.Time
	ttl     time.Duration
	tx      *revTx
}

func (t *revTxn) Tx() *revTx { return t.tx }

func (t *revTxn) Complete(ctx context.Context, resp idempotency.Response) error {
	now, err := t.s.now()
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		if !t.s.bugs.failedHolds {
			t.s.srv.txn(t.key, t.mod, false, nil, nil, 0) // free the key, if still ours
		}
		return err
	}
	expires := backend.Expiry(now, t.s.coarse(t.ttl))
	if t.s.clock == nil && t.s.bugs.noClockNoExpiry {
		expires = backend.MaxExpiry()
	}
	v := &revVal{rec: backend.Record{Key: t.key, Fingerprint: t.fp, Status: resp.Status, Header: resp.Header.Clone(),
		Body: bytes.Clone(resp.Body), CreatedAt: t.created, ExpiresAt: expires}}
	if ok, _ := t.s.srv.txn(t.key, t.mod, t.s.bugs.noOwnerCheck, v, t.tx.effects, 0); ok {
		return nil
	}
	if t.s.bugs.lostAsPlain {
		return fmt.Errorf("rev store: key %v: compare failed", t.key)
	}
	return fmt.Errorf("%w: rev store: key %v was taken over", backend.ErrLeaseLost, t.key)
}

func (t *revTxn) Rollback(context.Context) error {
	if t.s.bugs.staleRollback {
		t.s.srv.txn(t.key, 0, true, nil, nil, 0)
		return nil
	}
	t.s.srv.txn(t.key, t.mod, false, nil, nil, 0)
	return nil
}

// revHarness builds a fresh revServer per case; its stores (the fixture's
// and Reopen's) are clients with mistakes m.
func revHarness(m mistakes) conformance.Harness[*revTx] {
	return revHarnessWith(m, conformance.Features{Leases: true})
}

// revHarnessWith is revHarness declaring f; a store declaring an
// ExpiryGranularity expires records and leases in its units.
func revHarnessWith(m mistakes, f conformance.Features) conformance.Harness[*revTx] {
	return conformance.Harness[*revTx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*revTx] {
			lease := 30 * time.Second
			if opts.Lease > 0 {
				lease = opts.Lease
			}
			srv := newRevServer()
			client := func(host func() time.Time) *revStore {
				rs := &revStore{srv: srv, lease: lease, bugs: m, gap: time.Millisecond, purgeGap: 50 * time.Millisecond,
					clock: opts.Clock, host: host, granularity: f.ExpiryGranularity}
				if m.takeoverNoCAS {
					rs.takeoverGap = 50 * time.Millisecond
				}
				if m.purgeHeldOnly { // a round trip per delete, as a real client has
					rs.purgeGap, rs.deleteGap = 0, time.Millisecond
				}
				return rs
			}
			return conformance.Fixture[*revTx]{
				Store: client(time.Now),
				Reopen: func(context.Context) (idempotency.KeyStore[*revTx], error) {
					return client(time.Now), nil
				},
				ReopenAt: func(_ context.Context, host func() time.Time) (idempotency.KeyStore[*revTx], error) {
					return client(host), nil
				},
				Effect: func(_ context.Context, tx *revTx, tag string) error {
					tx.effects = append(tx.effects, tag)
					return nil
				},
				Count: func(_ context.Context, tag string) (int, error) { return srv.count(tag), nil },
			}
		},
		Features: f,
	}
}

// coarseFeatures are those of an etcd-like store whose leases last whole
// seconds: it cannot take a test clock, and its leases last at least 1s.
var coarseFeatures = conformance.Features{Leases: true, NoClock: true, ExpiryGranularity: time.Second, MinLease: time.Second}

// TestRevStoreConformance: the etcd-like lease store without mistakes
// passes the whole suite, and so does its coarse variant, which rounds
// every expiry and lease up to whole seconds.
func TestRevStoreConformance(t *testing.T) {
	t.Parallel() // with TestCatalogue
	t.Run("precise", func(t *testing.T) { conformance.Run(t, revHarness(mistakes{})) })
	t.Run("coarse", func(t *testing.T) { conformance.Run(t, revHarnessWith(mistakes{}, coarseFeatures)) })
}
