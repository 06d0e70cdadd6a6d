package conformance_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
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
	pending  bool
	leaseEnd time.Time
	rec      idempotency.Record
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

// get returns key's value and mod revision (0: absent), and the watch
// channel of this revision.
func (s *revServer) get(key idempotency.Key) (revVal, int64, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kv := s.kvs[key]
	if kv == nil {
		return revVal{}, 0, s.wake
	}
	v := kv.val
	v.rec.Header, v.rec.Body = v.rec.Header.Clone(), bytes.Clone(v.rec.Body)
	return v, kv.mod, s.wake
}

// txn writes v to key (delete if v is nil) and applies effects, if key's
// mod revision is still mod (0: absent), or always when blind. It returns
// whether it wrote, and the new mod revision.
func (s *revServer) txn(key idempotency.Key, mod int64, blind bool, v *revVal, effects []string) (bool, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := int64(0)
	if kv := s.kvs[key]; kv != nil {
		cur = kv.mod
	}
	if !blind && cur != mod {
		return false, cur
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
	// clock is the test clock (conformance.Options.Clock), or nil: the
	// server's own clock (here the host's) judges expiry.
	clock func() time.Time
}

// now is the clock that judges expiry: the test clock, range-checked, or
// the server's.
func (s *revStore) now() (time.Time, error) {
	if s.clock == nil {
		return time.Now(), nil
	}
	now := s.clock()
	return now, idempotency.CheckClock(now)
}

// revTx buffers the effects of one reservation, applied with Complete.
type revTx struct{ effects []string }

func (s *revStore) Reserve(ctx context.Context, r idempotency.Reservation) (idempotency.Txn[*revTx], *idempotency.Record, error) {
	deadline := time.Now().Add(r.Wait)
	for {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		v, mod, watch := s.srv.get(r.Key)
		now, err := s.now()
		if err != nil {
			return nil, nil, err
		}
		wall := time.Now() // leases run on real time
		switch {
		case mod != 0 && !v.pending && v.rec.ExpiresAt.After(now):
			return nil, &v.rec, nil
		case mod == 0 || !v.pending || !wall.Before(v.leaseEnd):
			if mod != 0 && v.pending {
				time.Sleep(max(s.gap, s.takeoverGap))
			} else {
				time.Sleep(s.gap)
			}
			nv := &revVal{pending: true, leaseEnd: time.Now().Add(s.lease),
				rec: idempotency.Record{Key: r.Key, Fingerprint: r.Fingerprint, CreatedAt: now, ExpiresAt: idempotency.Expiry(now, r.TTL)}}
			blind := (mod == 0 && s.bugs.blindReserve) || (mod != 0 && v.pending && s.bugs.takeoverNoCAS)
			if ok, rev := s.srv.txn(r.Key, mod, blind, nv, nil); ok {
				return &revTxn{s: s, key: r.Key, mod: rev, fp: r.Fingerprint, created: now, ttl: r.TTL, tx: &revTx{}}, nil, nil
			}
			continue // another client wrote first: read again
		}
		if !wall.Before(deadline) {
			return nil, nil, fmt.Errorf("%w: rev store: key %v is held", idempotency.ErrInProgress, r.Key)
		}
		wait := time.Until(deadline)
		if !s.bugs.waiterIgnoresLease {
			wait = min(wait, time.Until(v.leaseEnd))
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
	n := 0
	for _, c := range chosen {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if ok, _ := s.srv.txn(c.key, c.mod, s.bugs.purgeNoRecheck, nil, nil); ok {
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
			t.s.srv.txn(t.key, t.mod, false, nil, nil) // free the key, if still ours
		}
		return err
	}
	v := &revVal{rec: idempotency.Record{Key: t.key, Fingerprint: t.fp, Status: resp.Status, Header: resp.Header.Clone(),
		Body: bytes.Clone(resp.Body), CreatedAt: t.created, ExpiresAt: idempotency.Expiry(now, t.ttl)}}
	if ok, _ := t.s.srv.txn(t.key, t.mod, t.s.bugs.noOwnerCheck, v, t.tx.effects); ok {
		return nil
	}
	if t.s.bugs.lostAsPlain {
		return fmt.Errorf("rev store: key %v: compare failed", t.key)
	}
	return fmt.Errorf("%w: rev store: key %v was taken over", idempotency.ErrLeaseLost, t.key)
}

func (t *revTxn) Rollback(context.Context) error {
	if t.s.bugs.staleRollback {
		t.s.srv.txn(t.key, 0, true, nil, nil)
		return nil
	}
	t.s.srv.txn(t.key, t.mod, false, nil, nil)
	return nil
}

// revHarness builds a fresh revServer per case; its stores (the fixture's
// and Reopen's) are clients with mistakes m.
func revHarness(m mistakes) conformance.Harness[*revTx] {
	return conformance.Harness[*revTx]{
		NewFixture: func(t testing.TB, opts conformance.Options) conformance.Fixture[*revTx] {
			lease := 30 * time.Second
			if opts.Lease > 0 {
				lease = opts.Lease
			}
			srv := newRevServer()
			client := func() *revStore {
				rs := &revStore{srv: srv, lease: lease, bugs: m, gap: time.Millisecond, purgeGap: 50 * time.Millisecond, clock: opts.Clock}
				if m.takeoverNoCAS {
					rs.takeoverGap = 50 * time.Millisecond
				}
				return rs
			}
			return conformance.Fixture[*revTx]{
				Store: client(),
				Reopen: func(context.Context) (idempotency.KeyStore[*revTx], error) {
					return client(), nil
				},
				Effect: func(_ context.Context, tx *revTx, tag string) error {
					tx.effects = append(tx.effects, tag)
					return nil
				},
				Count: func(_ context.Context, tag string) (int, error) { return srv.count(tag), nil },
			}
		},
		Features: conformance.Features{Leases: true},
	}
}

// TestRevStoreConformance: the etcd-like lease store without mistakes
// passes the whole suite.
func TestRevStoreConformance(t *testing.T) {
	t.Parallel() // with TestCatalogue
	conformance.Run(t, revHarness(mistakes{}))
}
