// Package docstore is an in-memory key store written from the documentation of
// idempotency.KeyStore and package backend alone, to check that the contract's
// documentation is enough to write a store that passes package conformance.
// It is for tests only.
//
// Its "server" is one mutex-protected map shared by every instance opened on
// it (Store.Reopen). A reservation is held by a lease on the server's own
// (real, monotonic) time; a phase of an operation by a lease on the store's
// clock (the test clock when one is given). A transaction handle is a *LogTx:
// the effects done through it are applied to the shared effect log only when
// its reservation or phase commits.
package docstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// DefaultLease is the lease of a reservation when Config.Lease is zero.
const DefaultLease = 30 * time.Second

// pollInterval bounds how long a waiter sleeps before it looks again, so that
// holds that end by a clock it cannot set a timer on (a test clock) are seen.
const pollInterval = 10 * time.Millisecond

// Config configures a Store.
type Config struct {
	// Clock, if not nil, is a test clock read instead of the server's own
	// wherever the store judges or stores a time (expiry, creation, Purge,
	// phase leases). It never drives the lease of a reservation.
	Clock func() time.Time
	// Lease is how long a reservation holds its key without completing;
	// DefaultLease when zero. It is never renewed.
	Lease time.Duration
	// MaxConns, when > 0, caps the calls of this instance that may hold a
	// "connection" at once (a Reserve or Acquire and its open transaction).
	MaxConns int
}

// LogTx is the store's transaction handle: an append-only list of effects
// (strings) applied to the shared log when its transaction commits, and
// discarded when it rolls back.
type LogTx struct {
	mu      sync.Mutex
	effects []string
	done    bool
}

// Append records one effect in the transaction. It fails once the
// transaction has ended.
func (t *LogTx) Append(effect string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return errors.New("docstore: transaction already ended")
	}
	t.effects = append(t.effects, effect)
	return nil
}

// finish ends the transaction and returns its effects.
func (t *LogTx) finish() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done = true
	e := t.effects
	t.effects = nil
	return e
}

// state is the committed content of a key.
type state struct {
	fingerprint string
	created     time.Time
	completed   bool // else unfinished (progress != nil)
	status      int
	header      []byte
	body        []byte
	expires     time.Time // MaxExpiry for an unfinished key
	progress    []byte
	owner       string
	leaseEnd    time.Time // store's clock
	tries       int
}

// hold is an open transaction on a key: a reservation or a phase.
type hold struct {
	fingerprint string
	created     time.Time
	ttl         time.Duration
	phase       bool
	realEnd     time.Time // reservation: lease end on real time
	storeEnd    time.Time // phase: lease end on the store's clock
}

// entry is one key's slot in the shared map.
type entry struct {
	committed *state
	hold      *hold
	rev       uint64 // bumped on every change of committed
}

type quotaID struct {
	scope  string
	window time.Duration
	start  int64
}

type quotaCounter struct {
	keys, inFlight, bytes int64
}

// shared is the "server": the records, the effect log and the quota counters.
type shared struct {
	mu      sync.Mutex
	recs    map[backend.Key]*entry
	effects map[string]int
	quotas  map[quotaID]*quotaCounter
	changed chan struct{}
	rev     uint64
}

// Store is one instance of the in-memory store, with a connection pool of its
// own, on records it may share with other instances (Reopen).
type Store struct {
	sh    *shared
	cfg   Config
	conns chan struct{} // nil: no cap
}

// New returns a store on fresh, empty records.
func New(cfg Config) *Store {
	sh := &shared{
		recs:    map[backend.Key]*entry{},
		effects: map[string]int{},
		quotas:  map[quotaID]*quotaCounter{},
		changed: make(chan struct{}),
	}
	return newInstance(sh, cfg)
}

func newInstance(sh *shared, cfg Config) *Store {
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	s := &Store{sh: sh, cfg: cfg}
	if cfg.MaxConns > 0 {
		s.conns = make(chan struct{}, cfg.MaxConns)
	}
	return s
}

// Reopen returns another instance on the same records, with its own pool, as
// another process of the service would open.
func (s *Store) Reopen() *Store { return newInstance(s.sh, s.cfg) }

// Count reports how many committed effects equal effect.
func (s *Store) Count(effect string) int {
	s.sh.mu.Lock()
	defer s.sh.mu.Unlock()
	return s.sh.effects[effect]
}

var (
	_ idempotency.KeyStore[*LogTx] = (*Store)(nil)
	_ backend.KeyAdmin             = (*Store)(nil)
	_ backend.KeyLister            = (*Store)(nil)
	_ backend.Stepper[*LogTx]      = (*Store)(nil)
	_ backend.QuotaCounter         = (*Store)(nil)
)

// now reads the store's clock (the test clock if given) and checks it.
func (s *Store) now() (time.Time, error) {
	if s.cfg.Clock == nil {
		return time.Now().Round(0), nil
	}
	t := s.cfg.Clock()
	if err := backend.CheckClock(t); err != nil {
		return time.Time{}, err
	}
	return t.Round(0), nil
}

// acquireConn takes a connection of the pool, waiting while ctx lives.
func (s *Store) acquireConn(ctx context.Context) error {
	if s.conns == nil {
		return ctx.Err()
	}
	select {
	case s.conns <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Store) releaseConn() {
	if s.conns != nil {
		<-s.conns
	}
}

// notify wakes every waiter; called with sh.mu held.
func (sh *shared) notify() {
	close(sh.changed)
	sh.changed = make(chan struct{})
}

// live reports whether h still holds its key at real time rn and store time sn.
func (h *hold) live(rn, sn time.Time) bool {
	if h == nil {
		return false
	}
	if h.phase {
		return sn.Before(h.storeEnd)
	}
	return rn.Before(h.realEnd)
}

// record copies a completed state into a Record the caller owns.
func record(k backend.Key, st *state) (*backend.Record, error) {
	h, err := backend.UnmarshalHeader(st.header)
	if err != nil {
		return nil, err
	}
	var body []byte
	if st.body != nil {
		body = bytes.Clone(st.body)
	}
	return &backend.Record{
		Key: k, Fingerprint: st.fingerprint, Status: st.status, Header: h, Body: body,
		CreatedAt: st.created, ExpiresAt: st.expires,
	}, nil
}

// liveCompleted reports whether st is a completed record not yet expired.
func liveCompleted(st *state, now time.Time) bool {
	return st != nil && st.completed && st.expires.After(now)
}

// waitChange waits until something changes, pollInterval passes, the deadline
// passes or ctx ends. It is called with sh.mu held and returns with it held.
func (sh *shared) waitChange(ctx context.Context, deadline time.Time) error {
	ch := sh.changed
	sh.mu.Unlock()
	defer sh.mu.Lock()
	d := min(time.Until(deadline), pollInterval)
	if d < 0 {
		d = 0
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// Reserve takes r.Key for the caller in a new transaction, or returns its live
// completed record, or reports ErrInProgress once r.Wait ran out.
func (s *Store) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*LogTx], *backend.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("docstore: reserve %v: %w", r.Key, err)
	}
	deadline := time.Now().Add(r.Wait)
	if err := s.acquireConn(ctx); err != nil {
		return nil, nil, fmt.Errorf("docstore: reserve %v: %w", r.Key, err)
	}
	sh := s.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for {
		now, err := s.now()
		if err != nil {
			s.releaseConn()
			return nil, nil, fmt.Errorf("docstore: reserve %v: %w", r.Key, err)
		}
		rn := time.Now()
		e := sh.recs[r.Key]
		var held bool
		switch {
		case e == nil:
		case e.hold.live(rn, now):
			held = true
		case e.committed != nil && !e.committed.completed:
			held = true // unfinished: never taken over by Reserve
		case liveCompleted(e.committed, now):
			s.releaseConn()
			rec, err := record(r.Key, e.committed)
			return nil, rec, err
		}
		if !held {
			if e == nil {
				e = &entry{}
				sh.recs[r.Key] = e
			}
			h := &hold{fingerprint: r.Fingerprint, created: now, ttl: r.TTL, realEnd: rn.Add(s.cfg.Lease)}
			e.hold = h
			sh.notify()
			return &txn{s: s, key: r.Key, h: h, tx: &LogTx{}}, nil, nil
		}
		if r.NoWait || r.Wait <= 0 || !time.Now().Before(deadline) {
			s.releaseConn()
			return nil, nil, fmt.Errorf("docstore: key %v: %w", r.Key, backend.ErrInProgress)
		}
		// Waiting holds no connection.
		s.releaseConn()
		if err := sh.waitChange(ctx, deadline); err != nil {
			return nil, nil, fmt.Errorf("docstore: reserve %v: %w", r.Key, err)
		}
		sh.mu.Unlock()
		err = s.acquireConn(ctx)
		sh.mu.Lock()
		if err != nil {
			return nil, nil, fmt.Errorf("docstore: reserve %v: %w", r.Key, err)
		}
	}
}

// txn is a reservation held by a lease.
type txn struct {
	s    *Store
	key  backend.Key
	h    *hold
	tx   *LogTx
	once sync.Once
}

// Tx returns the transaction handle fn's effects go through.
func (t *txn) Tx() *LogTx { return t.tx }

// end releases the connection once.
func (t *txn) end() { t.once.Do(t.s.releaseConn) }

// Complete stores resp as the key's record and applies the effects, if the
// reservation still holds the key.
func (t *txn) Complete(ctx context.Context, resp backend.Response) error {
	defer t.end()
	sh := t.s.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	effects := t.tx.finish()
	e := sh.recs[t.key]
	if e == nil || e.hold != t.h {
		return fmt.Errorf("docstore: complete %v: %w", t.key, backend.ErrLeaseLost)
	}
	fail := func(err error) error {
		sh.release(t.key, e)
		return fmt.Errorf("docstore: complete %v: %w", t.key, err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	if resp.Status < 100 || resp.Status > 599 {
		return fail(fmt.Errorf("status %d out of range", resp.Status))
	}
	now, err := t.s.now()
	if err != nil {
		return fail(err)
	}
	var body []byte
	if resp.Body != nil {
		body = bytes.Clone(resp.Body)
	}
	e.committed = &state{
		fingerprint: t.h.fingerprint, created: t.h.created, completed: true,
		status: resp.Status, header: backend.MarshalHeader(resp.Header), body: body,
		expires: backend.Expiry(now, t.h.ttl),
	}
	e.hold = nil
	sh.rev++
	e.rev = sh.rev
	sh.apply(effects)
	sh.notify()
	return nil
}

// Rollback discards the effects and frees the key, unless the reservation was
// taken over.
func (t *txn) Rollback(ctx context.Context) error {
	defer t.end()
	sh := t.s.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	t.tx.finish()
	if e := sh.recs[t.key]; e != nil && e.hold == t.h {
		sh.release(t.key, e)
	}
	return nil
}

// release ends e's hold, dropping an entry left with nothing; sh.mu held.
func (sh *shared) release(k backend.Key, e *entry) {
	e.hold = nil
	if e.committed == nil {
		delete(sh.recs, k)
	}
	sh.notify()
}

// apply commits effects to the log; sh.mu held.
func (sh *shared) apply(effects []string) {
	for _, x := range effects {
		sh.effects[x]++
	}
}

// Purge deletes at most limit completed records expired by the store's clock.
// It chooses them first, then deletes in one atomic step each chosen record
// whose revision is unchanged, is not held, and is still expired.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	if err := s.acquireConn(ctx); err != nil {
		return 0, err
	}
	defer s.releaseConn()
	sh := s.sh
	type chosen struct {
		k   backend.Key
		rev uint64
	}
	var picks []chosen
	sh.mu.Lock()
	now, err := s.now()
	if err != nil {
		sh.mu.Unlock()
		return 0, err
	}
	for k, e := range sh.recs {
		if len(picks) == limit {
			break
		}
		if e.hold == nil && e.committed != nil && e.committed.completed && !e.committed.expires.After(now) {
			picks = append(picks, chosen{k, e.rev})
		}
	}
	sh.mu.Unlock()

	sh.mu.Lock()
	defer sh.mu.Unlock()
	now, err = s.now()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range picks {
		e := sh.recs[p.k]
		if e == nil || e.rev != p.rev || e.hold != nil || e.committed == nil ||
			!e.committed.completed || e.committed.expires.After(now) {
			continue
		}
		delete(sh.recs, p.k)
		n++
	}
	return n, nil
}

// info describes e for KeyAdmin and KeyLister; sh.mu held. ok is false when
// the key has no record (a lapsed hold on a new key).
func info(k backend.Key, e *entry, now, rn time.Time, withBody bool) (backend.KeyInfo, bool) {
	ki := backend.KeyInfo{Key: k}
	st := e.committed
	if e.hold.live(rn, now) {
		ki.State = backend.KeyInProgress
		ki.Fingerprint = e.hold.fingerprint
		ki.CreatedAt = e.hold.created
		if e.hold.phase {
			ki.LeaseEnds = e.hold.storeEnd
		} else {
			ki.ExpiresAt = backend.Expiry(e.hold.created, e.hold.ttl)
			ki.LeaseEnds = e.hold.realEnd
		}
		if st != nil && !st.completed {
			ki.Fingerprint = st.fingerprint
			ki.CreatedAt = st.created
			ki.ExpiresAt = backend.MaxExpiry()
			ki.Progress = bytes.Clone(st.progress)
			ki.Tries = st.tries
		}
		return ki, true
	}
	if st == nil {
		return ki, false
	}
	ki.Fingerprint = st.fingerprint
	ki.CreatedAt = st.created
	ki.ExpiresAt = st.expires
	if !st.completed {
		ki.State = backend.KeyUnfinished
		if now.Before(st.leaseEnd) {
			ki.State = backend.KeyInProgress
		}
		ki.Progress = bytes.Clone(st.progress)
		ki.Tries = st.tries
		ki.LeaseEnds = st.leaseEnd
		return ki, true
	}
	ki.State = backend.KeyCompleted
	if !st.expires.After(now) {
		ki.State = backend.KeyExpired
	}
	ki.Status = st.status
	ki.Header, _ = backend.UnmarshalHeader(st.header)
	ki.BodyLen = len(st.body)
	if withBody && st.body != nil {
		ki.Body = bytes.Clone(st.body)
	}
	return ki, true
}

// Inspect returns what the store holds for key, without waiting.
func (s *Store) Inspect(ctx context.Context, key backend.Key, body bool) (*backend.KeyInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sh := s.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now, err := s.now()
	if err != nil {
		return nil, err
	}
	e := sh.recs[key]
	if e == nil {
		return nil, fmt.Errorf("docstore: inspect %v: %w", key, backend.ErrNotFound)
	}
	ki, ok := info(key, e, now, time.Now(), body)
	if !ok {
		return nil, fmt.Errorf("docstore: inspect %v: %w", key, backend.ErrNotFound)
	}
	return &ki, nil
}

// Forget deletes key's record, refusing a held key with ErrInProgress.
func (s *Store) Forget(ctx context.Context, key backend.Key) (*backend.KeyInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sh := s.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now, err := s.now()
	if err != nil {
		return nil, err
	}
	e := sh.recs[key]
	if e == nil {
		return nil, fmt.Errorf("docstore: forget %v: %w", key, backend.ErrNotFound)
	}
	ki, ok := info(key, e, now, time.Now(), false)
	if !ok {
		return nil, fmt.Errorf("docstore: forget %v: %w", key, backend.ErrNotFound)
	}
	if ki.State == backend.KeyInProgress {
		return nil, fmt.Errorf("docstore: forget %v: %w", key, backend.ErrInProgress)
	}
	delete(sh.recs, key)
	sh.notify()
	return &ki, nil
}

// List returns one page of q.Scope's keys: held and unfinished ones first,
// then the others, each part in byte order of ID.
func (s *Store) List(ctx context.Context, q backend.ListQuery) (backend.KeyPage, error) {
	if err := q.Validate(); err != nil {
		return backend.KeyPage{}, err
	}
	if err := ctx.Err(); err != nil {
		return backend.KeyPage{}, err
	}
	sh := s.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now, err := s.now()
	if err != nil {
		return backend.KeyPage{}, err
	}
	rn := time.Now()
	var first, rest []backend.KeyInfo
	for k, e := range sh.recs {
		if k.Scope != q.Scope {
			continue
		}
		ki, ok := info(k, e, now, rn, false)
		if !ok {
			continue
		}
		if ki.State == backend.KeyInProgress || ki.State == backend.KeyUnfinished {
			first = append(first, ki)
		} else {
			rest = append(rest, ki)
		}
	}
	byID := func(l []backend.KeyInfo) {
		sort.Slice(l, func(i, j int) bool { return l[i].Key.ID < l[j].Key.ID })
	}
	byID(first)
	byID(rest)
	after := func(l []backend.KeyInfo, id string) []backend.KeyInfo {
		i := sort.Search(len(l), func(i int) bool { return l[i].Key.ID > id })
		return l[i:]
	}
	if q.After != nil {
		if q.After.Unfinished {
			first = after(first, q.After.ID)
		} else {
			first = nil
			rest = after(rest, q.After.ID)
		}
	}
	all := append(first, rest...)
	var page backend.KeyPage
	if len(all) > q.Limit {
		all = all[:q.Limit]
		last := all[len(all)-1]
		page.Next = &backend.ListCursor{
			Unfinished: last.State == backend.KeyInProgress || last.State == backend.KeyUnfinished,
			ID:         last.Key.ID,
		}
	}
	page.Keys = all
	return page, nil
}

// Stats counts the records by state, by the store's clock.
func (s *Store) Stats(ctx context.Context) (backend.Stats, error) {
	if err := ctx.Err(); err != nil {
		return backend.Stats{}, err
	}
	sh := s.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now, err := s.now()
	if err != nil {
		return backend.Stats{}, err
	}
	rn := time.Now()
	var st backend.Stats
	for k, e := range sh.recs {
		ki, ok := info(k, e, now, rn, false)
		if !ok {
			continue
		}
		switch ki.State {
		case backend.KeyInProgress:
			st.InProgress++
		case backend.KeyCompleted:
			st.Completed++
			st.BodyBytes += int64(ki.BodyLen)
		case backend.KeyUnfinished:
			st.Unfinished++
		case backend.KeyExpired:
			st.Expired++
		}
		if ki.State == backend.KeyInProgress || ki.State == backend.KeyUnfinished {
			if st.OldestUnfinished.IsZero() || ki.CreatedAt.Before(st.OldestUnfinished) {
				st.OldestUnfinished = ki.CreatedAt
			}
		}
		if e.committed != nil && !e.committed.completed && e.committed.tries > 0 {
			st.Failing++
		}
	}
	return st, nil
}

// Acquire opens a phase on a.Key for the run a.Owner (see backend.Stepper).
func (s *Store) Acquire(ctx context.Context, a backend.Acquisition) (backend.Phase[*LogTx], *backend.Record, error) {
	if err := a.Validate(); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("docstore: acquire %v: %w", a.Key, err)
	}
	deadline := time.Now().Add(a.Wait)
	if err := s.acquireConn(ctx); err != nil {
		return nil, nil, fmt.Errorf("docstore: acquire %v: %w", a.Key, err)
	}
	sh := s.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for {
		now, err := s.now()
		if err != nil {
			s.releaseConn()
			return nil, nil, fmt.Errorf("docstore: acquire %v: %w", a.Key, err)
		}
		rn := time.Now()
		e := sh.recs[a.Key]
		held := false // held by an open transaction: wait
		leased := false
		switch {
		case e == nil:
		case e.hold.live(rn, now):
			held = true
		case e.committed == nil:
		case e.committed.completed:
			if liveCompleted(e.committed, now) {
				s.releaseConn()
				rec, err := record(a.Key, e.committed)
				return nil, rec, err
			}
		default: // unfinished, no live open phase
			if now.Before(e.committed.leaseEnd) && e.committed.owner != a.Owner {
				leased = true
			}
		}
		if leased {
			s.releaseConn()
			return nil, nil, fmt.Errorf("docstore: key %v leased: %w", a.Key, backend.ErrInProgress)
		}
		if !held {
			if e == nil {
				e = &entry{}
				sh.recs[a.Key] = e
			}
			h := &hold{fingerprint: a.Fingerprint, created: now, ttl: a.TTL, phase: true, storeEnd: now.Add(a.Lease)}
			p := &phase{s: s, key: a.Key, a: a, h: h, tx: &LogTx{}}
			if st := e.committed; st != nil && !st.completed {
				h.fingerprint = st.fingerprint
				h.created = st.created
				p.progress = bytes.Clone(st.progress)
				p.tries = st.tries
			}
			e.hold = h
			sh.notify()
			return p, nil, nil
		}
		if a.NoWait || a.Wait <= 0 || !time.Now().Before(deadline) {
			s.releaseConn()
			return nil, nil, fmt.Errorf("docstore: key %v: %w", a.Key, backend.ErrInProgress)
		}
		s.releaseConn()
		if err := sh.waitChange(ctx, deadline); err != nil {
			return nil, nil, fmt.Errorf("docstore: acquire %v: %w", a.Key, err)
		}
		sh.mu.Unlock()
		err = s.acquireConn(ctx)
		sh.mu.Lock()
		if err != nil {
			return nil, nil, fmt.Errorf("docstore: acquire %v: %w", a.Key, err)
		}
	}
}

// Abandoned lists unfinished keys whose lease ended at least q.Grace ago and
// whose tries are under q.MaxTries, the longest ended first.
func (s *Store) Abandoned(ctx context.Context, q backend.AbandonedQuery) ([]backend.AbandonedKey, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sh := s.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now, err := s.now()
	if err != nil {
		return nil, err
	}
	rn := time.Now()
	var out []backend.AbandonedKey
	for k, e := range sh.recs {
		st := e.committed
		if st == nil || st.completed || e.hold.live(rn, now) {
			continue
		}
		if st.leaseEnd.After(now.Add(-q.Grace)) || st.tries >= q.MaxTries {
			continue
		}
		out = append(out, backend.AbandonedKey{
			Key: k, Fingerprint: st.fingerprint, Progress: bytes.Clone(st.progress),
			Tries: st.tries, LeaseEnded: st.leaseEnd,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LeaseEnded.Before(out[j].LeaseEnded) })
	if len(out) > q.Limit {
		out = out[:q.Limit]
	}
	return out, nil
}

// phase is one transaction of an operation on its key, held by a lease on the
// store's clock.
type phase struct {
	s        *Store
	key      backend.Key
	a        backend.Acquisition
	h        *hold
	tx       *LogTx
	progress []byte
	tries    int
	once     sync.Once
}

// Tx returns the transaction handle the phase's writes go through.
func (p *phase) Tx() *LogTx { return p.tx }

// Fingerprint is the fingerprint the operation started with.
func (p *phase) Fingerprint() string { return p.h.fingerprint }

// Progress is the progress last saved, nil for a new key.
func (p *phase) Progress() []byte { return bytes.Clone(p.progress) }

// Tries is how many runs released the key after a failure.
func (p *phase) Tries() int { return p.tries }

func (p *phase) end() { p.once.Do(p.s.releaseConn) }

// commit runs the checks every committing end shares and, if they pass, calls
// write with the entry and the store's clock and applies the effects.
func (p *phase) commit(ctx context.Context, what string, write func(e *entry, now time.Time) error) error {
	defer p.end()
	sh := p.s.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	effects := p.tx.finish()
	e := sh.recs[p.key]
	if e == nil || e.hold != p.h {
		return fmt.Errorf("docstore: %s %v: %w", what, p.key, backend.ErrLeaseLost)
	}
	fail := func(err error) error {
		sh.release(p.key, e)
		return fmt.Errorf("docstore: %s %v: %w", what, p.key, err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	now, err := p.s.now()
	if err != nil {
		return fail(err)
	}
	if err := write(e, now); err != nil {
		return fail(err)
	}
	e.hold = nil
	sh.rev++
	e.rev = sh.rev
	sh.apply(effects)
	sh.notify()
	return nil
}

func (p *phase) unfinished(progress []byte, now, leaseEnd time.Time, tries int) *state {
	return &state{
		fingerprint: p.h.fingerprint, created: p.h.created, expires: backend.MaxExpiry(),
		progress: bytes.Clone(progress), owner: p.a.Owner, leaseEnd: leaseEnd, tries: tries,
	}
}

// Save commits the phase with progress and the owner's lease renewed.
func (p *phase) Save(ctx context.Context, progress []byte) error {
	if err := backend.CheckProgress(progress); err != nil {
		p.Rollback(ctx)
		return err
	}
	return p.commit(ctx, "save", func(e *entry, now time.Time) error {
		e.committed = p.unfinished(progress, now, now.Add(p.a.Lease), p.tries)
		return nil
	})
}

// Release commits the phase with progress, the lease ended now and one more
// try.
func (p *phase) Release(ctx context.Context, progress []byte) error {
	if err := backend.CheckProgress(progress); err != nil {
		p.Rollback(ctx)
		return err
	}
	return p.commit(ctx, "release", func(e *entry, now time.Time) error {
		e.committed = p.unfinished(progress, now, now, p.tries+1)
		return nil
	})
}

// Complete stores resp as the key's completed record and commits.
func (p *phase) Complete(ctx context.Context, resp backend.Response) error {
	return p.commit(ctx, "complete", func(e *entry, now time.Time) error {
		if resp.Status < 100 || resp.Status > 599 {
			return fmt.Errorf("status %d out of range", resp.Status)
		}
		var body []byte
		if resp.Body != nil {
			body = bytes.Clone(resp.Body)
		}
		e.committed = &state{
			fingerprint: p.h.fingerprint, created: p.h.created, completed: true,
			status: resp.Status, header: backend.MarshalHeader(resp.Header), body: body,
			expires: backend.Expiry(now, p.a.TTL),
		}
		return nil
	})
}

// Rollback discards the phase's writes and its lease; a new key is free again.
func (p *phase) Rollback(ctx context.Context) error {
	defer p.end()
	sh := p.s.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	p.tx.finish()
	if e := sh.recs[p.key]; e != nil && e.hold == p.h {
		sh.release(p.key, e)
	}
	return nil
}

// windowStart is the start of q's window holding now.
func windowStart(now time.Time, w time.Duration) time.Time {
	n := now.UnixNano()
	start := n - n%int64(w)
	if n%int64(w) < 0 {
		start -= int64(w)
	}
	return time.Unix(0, start).UTC()
}

// AdmitQuota counts q.Key in its scope's current window unless it replays or
// a limit is reached. It is atomic under the server's lock.
func (s *Store) AdmitQuota(ctx context.Context, q backend.QuotaCheck) (backend.QuotaAdmission, error) {
	if err := ctx.Err(); err != nil {
		return backend.QuotaAdmission{}, err
	}
	sh := s.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now, err := s.now()
	if err != nil {
		return backend.QuotaAdmission{}, err
	}
	if e := sh.recs[q.Key]; e != nil && e.hold == nil && liveCompleted(e.committed, now) {
		return backend.QuotaAdmission{Replay: true}, nil
	}
	w := q.Quota.Window
	start := windowStart(now, w)
	adm := backend.QuotaAdmission{WindowStart: start, RetryAfter: start.Add(w).Sub(now)}
	id := quotaID{scope: q.Key.Scope, window: w, start: start.UnixNano()}
	c := sh.quotas[id]
	if c == nil {
		c = &quotaCounter{}
	}
	maxKeys, maxInFlight, maxBytes := q.Quota.Limits()
	switch {
	case c.keys >= maxKeys:
		adm.Over = backend.QuotaKeys
	case c.inFlight >= maxInFlight:
		adm.Over = backend.QuotaInFlight
	case c.bytes >= maxBytes:
		adm.Over = backend.QuotaBytes
	default:
		c.keys++
		c.inFlight++
		sh.quotas[id] = c
		adm.Counted = true
	}
	return adm, nil
}

// EndQuota ends an admission AdmitQuota counted, in its own window.
func (s *Store) EndQuota(ctx context.Context, e backend.QuotaEnd) error {
	sh := s.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c := sh.quotas[quotaID{scope: e.Scope, window: e.Window, start: e.WindowStart.UnixNano()}]
	if c == nil {
		return nil // window purged: not recreated
	}
	c.inFlight--
	if !e.Created {
		c.keys--
	}
	c.bytes += e.Bytes
	return nil
}

// PurgeQuota deletes at most limit counters of windows that ended.
func (s *Store) PurgeQuota(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	sh := s.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now, err := s.now()
	if err != nil {
		return 0, err
	}
	n := 0
	for id := range sh.quotas {
		if n >= limit {
			break
		}
		if !time.Unix(0, id.start).Add(id.window).After(now) {
			delete(sh.quotas, id)
			n++
		}
	}
	return n, nil
}
