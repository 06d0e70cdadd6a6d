package memstore

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

var (
	_ backend.Stepper[*Tx] = (*Store)(nil)
	_ backend.KeyAdmin     = (*Store)(nil)
	_ backend.KeyLister    = (*Store)(nil)
)

// opRow is an unfinished operation's committed row.
type opRow struct {
	fp        string
	progress  []byte
	owner     string
	leaseEnds time.Time
	tries     int
	created   time.Time
}

// checkAcquisition refuses an Acquisition outside the contract's bounds.
func checkAcquisition(a backend.Acquisition) error {
	if err := a.Validate(); err != nil {
		return fmt.Errorf("memstore: %w", err)
	}
	return nil
}

// checkProgress refuses a nil or oversized progress.
func checkProgress(progress []byte) error {
	if err := backend.CheckProgress(progress); err != nil {
		return fmt.Errorf("memstore: %w", err)
	}
	return nil
}

// Acquire implements [backend.Stepper].
func (s *Store) Acquire(ctx context.Context, a backend.Acquisition) (backend.Phase[*Tx], *backend.Record, error) {
	if err := checkAcquisition(a); err != nil {
		return nil, nil, err
	}
	if s.ReserveErr != nil {
		if err := s.ReserveErr(); err != nil {
			return nil, nil, err
		}
	}
	var p *phase
	rec, _, err := s.take(ctx, a.Key, a.Wait, func(now time.Time, busy bool) error {
		if busy {
			return nil
		}
		p = &phase{txn: txn{s: s, r: a.Reservation, created: now, tx: &Tx{}}, a: a, fp: a.Fingerprint}
		if row, ok := s.ops[a.Key]; ok {
			if row.owner != a.Owner && row.leaseEnds.After(now) {
				return fmt.Errorf("%w: memstore: leased until %v", idempotency.ErrInProgress, row.leaseEnds)
			}
			p.fp, p.progress, p.tries, p.created = row.fp, bytes.Clone(row.progress), row.tries, row.created
		}
		return nil
	})
	if rec != nil || err != nil {
		return nil, rec, err
	}
	p.gen = s.hold(a.Key, p.txn.created, a.Lease)
	return p, nil, nil
}

// Abandoned implements [backend.Stepper].
func (s *Store) Abandoned(_ context.Context, q backend.AbandonedQuery) ([]backend.AbandonedKey, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	now, err := s.now()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []backend.AbandonedKey
	for k, row := range s.ops {
		if row.leaseEnds.After(now.Add(-q.Grace)) || row.tries >= q.MaxTries {
			continue
		}
		out = append(out, backend.AbandonedKey{Key: k, Fingerprint: row.fp, Progress: bytes.Clone(row.progress), Tries: row.tries, LeaseEnded: row.leaseEnds})
	}
	slices.SortFunc(out, func(a, b backend.AbandonedKey) int { return a.LeaseEnded.Compare(b.LeaseEnded) })
	return out[:min(len(out), q.Limit)], nil
}

// phase is a transaction of [Store.Acquire].
type phase struct {
	txn
	a        backend.Acquisition
	fp       string
	progress []byte
	tries    int
	created  time.Time // of the unfinished row; zero for a new key
	gen      uint64    // of its lease's hold (Store.StepLeases)
}

func (p *phase) Fingerprint() string { return p.fp }
func (p *phase) Progress() []byte    { return p.progress }
func (p *phase) Tries() int          { return p.tries }

func (p *phase) Save(_ context.Context, progress []byte) error { return p.commit(progress, false) }

func (p *phase) Release(_ context.Context, progress []byte) error { return p.commit(progress, true) }

func (p *phase) commit(progress []byte, release bool) error {
	s := p.s
	now, err := s.now()
	if err == nil {
		err = checkProgress(progress)
	}
	if err != nil {
		_ = p.Rollback(context.Background())
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := p.stale(); err != nil {
		return err
	}
	for _, e := range p.tx.effects {
		s.counts[e]++
	}
	row := &opRow{fp: p.fp, progress: bytes.Clone(progress), owner: p.a.Owner, leaseEnds: now.Add(p.a.Lease), tries: p.tries, created: p.created}
	if row.created.IsZero() {
		row.created = p.txn.created
	}
	if release {
		row.owner, row.leaseEnds, row.tries = "", now, row.tries+1
	}
	delete(s.records, p.r.Key) // an expired record the operation replaced
	s.ops[p.r.Key] = row
	p.releasePhase()
	return nil
}

func (p *phase) Complete(ctx context.Context, resp idempotency.Response) error {
	if !p.created.IsZero() {
		p.txn.created = p.created
	}
	s := p.s
	now, err := s.now()
	if err != nil {
		_ = p.Rollback(context.Background())
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := p.stale(); err != nil {
		return err
	}
	delete(s.ops, p.r.Key)
	p.txn.commit(now, resp)
	p.releasePhase()
	return nil
}

// Inspect implements [backend.KeyAdmin].
func (s *Store) Inspect(_ context.Context, key idempotency.Key, body bool) (*backend.KeyInfo, error) {
	now, err := s.now()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	info := s.info(key, now)
	if info == nil {
		return nil, fmt.Errorf("memstore: %w", idempotency.ErrNotFound)
	}
	if rec, ok := s.records[key]; body && ok && info.State != backend.KeyInProgress {
		info.Body = bytes.Clone(rec.Body)
	}
	return info, nil
}

// info describes key; s.mu is held.
func (s *Store) info(key idempotency.Key, now time.Time) *backend.KeyInfo {
	if row, ok := s.ops[key]; ok {
		st := backend.KeyUnfinished
		if _, busy := s.held[key]; busy || row.leaseEnds.After(now) {
			st = backend.KeyInProgress
		}
		return &backend.KeyInfo{Key: key, State: st, Fingerprint: row.fp, CreatedAt: row.created, ExpiresAt: backend.MaxExpiry(),
			Progress: bytes.Clone(row.progress), Tries: row.tries, LeaseEnds: row.leaseEnds}
	}
	if _, busy := s.held[key]; busy {
		return &backend.KeyInfo{Key: key, State: backend.KeyInProgress}
	}
	rec, ok := s.records[key]
	if !ok {
		return nil
	}
	st := backend.KeyCompleted
	if !rec.ExpiresAt.After(now) {
		st = backend.KeyExpired
	}
	return &backend.KeyInfo{Key: key, State: st, Fingerprint: rec.Fingerprint, Status: rec.Status, Header: rec.Header.Clone(),
		BodyLen: len(rec.Body), CreatedAt: rec.CreatedAt, ExpiresAt: rec.ExpiresAt}
}

// Forget implements [backend.KeyAdmin].
func (s *Store) Forget(_ context.Context, key idempotency.Key) (*backend.KeyInfo, error) {
	now, err := s.now()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	info := s.info(key, now)
	switch {
	case info == nil:
		return nil, fmt.Errorf("memstore: %w", idempotency.ErrNotFound)
	case info.State == backend.KeyInProgress:
		return nil, fmt.Errorf("memstore: key %v: %w", key, idempotency.ErrInProgress)
	}
	delete(s.ops, key)
	delete(s.records, key)
	return info, nil
}

// List implements [backend.KeyLister].
func (s *Store) List(_ context.Context, q backend.ListQuery) (backend.KeyPage, error) {
	if err := q.Validate(); err != nil {
		return backend.KeyPage{}, err
	}
	now, err := s.now()
	if err != nil {
		return backend.KeyPage{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := map[idempotency.Key]bool{}
	for k := range s.ops {
		keys[k] = true
	}
	for k := range s.records {
		keys[k] = true
	}
	var all []backend.KeyInfo
	for k := range keys {
		if k.Scope == q.Scope {
			all = append(all, *s.info(k, now))
		}
	}
	first := func(i backend.KeyInfo) bool { return i.Progress != nil || i.State == backend.KeyInProgress }
	slices.SortFunc(all, func(a, b backend.KeyInfo) int {
		if fa, fb := first(a), first(b); fa != fb {
			if fa {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Key.ID, b.Key.ID)
	})
	if c := q.After; c != nil {
		i := slices.IndexFunc(all, func(k backend.KeyInfo) bool {
			return (first(k) == c.Unfinished && k.Key.ID > c.ID) || (c.Unfinished && !first(k))
		})
		if i < 0 {
			i = len(all)
		}
		all = all[i:]
	}
	var page backend.KeyPage
	if len(all) > q.Limit {
		all = all[:q.Limit]
		last := all[len(all)-1]
		page.Next = &backend.ListCursor{Unfinished: first(last), ID: last.Key.ID}
	}
	page.Keys = all
	return page, nil
}

// Stats implements [backend.KeyLister].
func (s *Store) Stats(context.Context) (backend.Stats, error) {
	now, err := s.now()
	if err != nil {
		return backend.Stats{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var st backend.Stats
	for k := range s.ops {
		i := s.info(k, now)
		if i.State == backend.KeyInProgress {
			st.InProgress++
		} else {
			st.Unfinished++
		}
		if i.Tries > 0 {
			st.Failing++
		}
		if st.OldestUnfinished.IsZero() || i.CreatedAt.Before(st.OldestUnfinished) {
			st.OldestUnfinished = i.CreatedAt
		}
	}
	for _, rec := range s.records {
		if rec.ExpiresAt.After(now) {
			st.Completed++
			st.BodyBytes += int64(len(rec.Body))
		} else {
			st.Expired++
		}
	}
	return st, nil
}
