package redis

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
)

// Defaults and limits of [Config].
const (
	// DefaultPrefix is the key prefix when Config.Prefix is empty.
	DefaultPrefix = "idempotency:"
	// DefaultLease is the lease of a reservation when Config.Lease is zero.
	DefaultLease = 30 * time.Second
	// MinLease is the shortest lease accepted.
	MinLease = 10 * time.Millisecond
	// MaxPrefixLen is the longest prefix accepted, in bytes.
	MaxPrefixLen = 200
)

// Config tunes a [Store]. The zero value (or nil) means the defaults.
type Config struct {
	// Prefix starts every key of the store: 1 to 200 bytes of printable
	// ASCII. A hash tag in it ("{...}", not empty) puts every key of the
	// store in one Cluster slot. Defaults to [DefaultPrefix].
	Prefix string
	// Lease is how long a reservation holds its key without being renewed.
	// While fn runs the lease is renewed every Lease/3; if the holder dies,
	// the key is free Lease after its last renewal, and a retry can then run
	// the effect again (see the package doc). At least [MinLease]. Defaults
	// to [DefaultLease].
	Lease time.Duration
	// WaitReplicas, when > 0, makes a completion wait (Redis WAIT, on the
	// connection that ran its EXEC) until that many replicas acknowledged
	// it; fewer within ReplicaTimeout make Do fail with [ErrNotReplicated]
	// instead of answering. Defaults to 0: answer once the primary applied
	// it (a failover can then lose an acknowledged completion).
	WaitReplicas int
	// ReplicaTimeout bounds that wait: at least 1ms. Defaults to
	// [DefaultReplicaTimeout].
	ReplicaTimeout time.Duration
}

// Store is an [idempotency.KeyStore] on Redis. It is safe for concurrent use.
// Build it with [New].
type Store struct {
	client     goredis.UniversalClient
	prefix     string
	lease      time.Duration
	renewEvery time.Duration
	poll       time.Duration

	reserveScript *goredis.Script
	renewScript   *goredis.Script
	releaseScript *goredis.Script

	tokens string // starts every token of this Store
	repl   replication

	mu      sync.Mutex
	holds   map[string]*hold // by token: the reservations this Store is making or holds
	looking map[string]*hold // by record key: the caller running the reservation script
	looks   uint64           // looks started so far
}

var _ idempotency.KeyStore[*Tx] = (*Store)(nil)

// releaseTimeout bounds the clean-up of a reservation (Rollback, or after a
// failed Complete), which runs even when the caller's context is done.
const releaseTimeout = 5 * time.Second

// New returns a Store on client. A nil cfg means the defaults; a bad field
// gives an error wrapping [idempotency.ErrInvalidConfig]. It does no I/O.
func New(client goredis.UniversalClient, cfg *Config) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil redis client", idempotency.ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if err := validatePrefix(c.Prefix); err != nil {
		return nil, err
	}
	switch {
	case c.Lease == 0:
		c.Lease = DefaultLease
	case c.Lease < MinLease:
		return nil, fmt.Errorf("%w: redis lease %v shorter than %v", idempotency.ErrInvalidConfig, c.Lease, MinLease)
	}
	repl, err := newReplication(c)
	if err != nil {
		return nil, err
	}
	return &Store{
		repl:          repl,
		client:        client,
		prefix:        c.Prefix,
		lease:         c.Lease,
		renewEvery:    c.Lease / 3,
		poll:          min(max(c.Lease/10, 50*time.Millisecond), time.Second),
		reserveScript: goredis.NewScript(reserveLua),
		renewScript:   goredis.NewScript(renewLua),
		releaseScript: goredis.NewScript(releaseLua),
		tokens:        rand.Text()[:8] + ".",
		holds:         make(map[string]*hold),
		looking:       make(map[string]*hold),
	}, nil
}

// validatePrefix refuses prefixes that are too long, not printable ASCII,
// or whose first '{' opens an empty or unclosed hash tag: Redis would then
// hash whole key names, or a tag spilling into the record's own, and the
// keys of one record could land in different Cluster slots.
func validatePrefix(p string) error {
	if len(p) > MaxPrefixLen {
		return fmt.Errorf("%w: redis prefix is %d bytes, longer than %d", idempotency.ErrInvalidConfig, len(p), MaxPrefixLen)
	}
	for i := 0; i < len(p); i++ {
		if p[i] < 0x20 || p[i] > 0x7e {
			return fmt.Errorf("%w: redis prefix byte %d is %#02x, not printable ASCII", idempotency.ErrInvalidConfig, i, p[i])
		}
	}
	if open := strings.IndexByte(p, '{'); open >= 0 {
		end := strings.IndexByte(p[open+1:], '}')
		if end <= 0 {
			return fmt.Errorf("%w: redis prefix %q opens an empty or unclosed hash tag", idempotency.ErrInvalidConfig, p)
		}
	}
	return nil
}

// keys names the Redis keys of one record; all share one hash tag.
type keys struct {
	base string // prefix + "{tag}:"
	rec  string // the record hash
	wake string // the pub/sub channel waiters listen on
}

func (s *Store) keysFor(k idempotency.Key) keys {
	h := sha256.New()
	h.Write([]byte(k.Scope))
	h.Write([]byte{0})
	h.Write([]byte(k.ID))
	base := s.prefix + "{" + hex.EncodeToString(h.Sum(nil)[:16]) + "}:"
	return keys{base: base, rec: base + "rec", wake: base + "wake"}
}

// Record fields and states.
const (
	statePending   = "pending"
	stateCompleted = "completed"
	msgCompleted   = "completed"
)

// reserveLua takes the key unless a live record holds it.
// KEYS[1] record. ARGV: token, scope, id, fingerprint, now ms, expires ms,
// lease ms. Returns {"reserved"}, {"pending", pttl ms, owner} or
// {"completed", fingerprint, status, header, body, created, expires, scope,
// id}.
const reserveLua = `
local r = redis.call('HMGET', KEYS[1], 'state', 'owner', 'fp', 'status', 'hdr', 'body', 'created', 'expires', 'scope', 'id')
if r[1] == 'completed' then
  if tonumber(r[8]) > tonumber(ARGV[5]) then
    return {'completed', r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10]}
  end
elseif r[1] == 'pending' then
  if r[2] == ARGV[1] then
    return {'reserved'}
  end
  return {'pending', tostring(redis.call('PTTL', KEYS[1])), r[2]}
elseif r[1] then
  return redis.error_reply('idempotency: record ' .. KEYS[1] .. ' has unknown state ' .. tostring(r[1]))
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'state', 'pending', 'owner', ARGV[1], 'scope', ARGV[2], 'id', ARGV[3],
  'fp', ARGV[4], 'created', ARGV[5], 'expires', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return {'reserved'}
`

// renewLua extends the lease if the caller still owns the record.
// KEYS[1] record. ARGV: token, lease ms. Returns 1 if renewed, else 0.
const renewLua = `
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`

// releaseLua deletes a reservation the caller still owns and wakes waiters.
// KEYS[1] record. ARGV: token, channel. Returns 1 if deleted, else 0.
const releaseLua = `
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
`

// Reserve implements [idempotency.KeyStore]. One call of the reservation
// script (a single round trip, shared by the callers of the same key that
// arrive while it runs) reserves a free key or returns a completed record.
// A caller that finds the key pending waits, as the package doc describes:
// for a holder in this Store, on the holder itself; for any other, on the
// key's wake-up channel, subscribed before it looks again.
func (s *Store) Reserve(ctx context.Context, r idempotency.Reservation) (idempotency.Txn[*Tx], *idempotency.Record, error) {
	k := s.keysFor(r.Key)
	token := s.tokens + rand.Text()
	var deadline time.Time
	if r.Wait > 0 {
		deadline = time.Now().Add(r.Wait)
	}
	// Known before the script can reserve, so that this Store's waiters
	// find the holder as soon as Redis names it.
	own := s.addHold(token)
	var w *waiter
	var ended string // a holder of this Store that ended while Redis still named it
	var after uint64 // looks up to this one are older than what this caller waits to see
	defer func() {
		w.close()
		if own != nil {
			s.endHold(own)
		}
	}()
	for {
		out, err := s.look(ctx, k, r, own, after)
		if err != nil {
			return nil, nil, err
		}
		switch {
		case out.rec != nil:
			return nil, out.rec, nil
		case out.reserved:
			t := s.newTxn(k, r, own)
			own = nil
			return t, nil, nil
		}
		remaining := time.Until(deadline)
		if r.Wait <= 0 || remaining <= 0 {
			return nil, nil, fmt.Errorf("%w: key %q", idempotency.ErrInProgress, r.Key.ID)
		}
		h := s.holdOf(out.owner)
		if h == nil && out.owner != ended && strings.HasPrefix(out.owner, s.tokens) {
			// The holder was this Store's and has just ended: look again
			// at once (and wait as for any holder if Redis still names it).
			ended = out.owner
			after = s.lookSeq()
			continue
		}
		if h == nil && w == nil {
			// Subscribe, then look again: a completion after that look
			// publishes to a live subscription.
			if w, err = s.subscribe(ctx, k.wake, remaining); err != nil {
				return nil, nil, fmt.Errorf("%w: waiting for key %q: %w", idempotency.ErrInProgress, r.Key.ID, err)
			}
			after = s.lookSeq()
			continue
		}
		d := min(remaining, s.poll)
		if out.pttl >= 0 {
			d = min(d, out.pttl+time.Millisecond)
		}
		rec, err := wait(ctx, h, w, d)
		after = s.lookSeq()
		if err != nil {
			return nil, nil, fmt.Errorf("%w: waiting for key %q: %w", idempotency.ErrInProgress, r.Key.ID, err)
		}
		if rec != nil && rec.Key == r.Key && rec.ExpiresAt.UnixMilli() > r.Now.UnixMilli() {
			return nil, rec, nil
		}
	}
}

// hold is a reservation this Store is making or holds, for the Store's own
// waiters: done is closed once it has ended in Redis (completed, released,
// found lost, or never made).
type hold struct {
	token   string
	done    chan struct{}
	waiters atomic.Int32 // callers waiting on done
	// Callers of the same key waiting for this caller's reservation
	// script (see look), nil while there are none, and which look that
	// is. Guarded by Store.mu.
	joined *lookResult
	seq    uint64
	// Set before done is closed when Complete succeeded and someone
	// waited: the stored record, as the reservation script would return it.
	rec *idempotency.Record
}

func (s *Store) addHold(token string) *hold {
	h := &hold{token: token, done: make(chan struct{})}
	s.mu.Lock()
	s.holds[token] = h
	s.mu.Unlock()
	return h
}

// endHold wakes h's waiters; they look at the key again, or take the
// record h carries.
func (s *Store) endHold(h *hold) {
	s.mu.Lock()
	delete(s.holds, h.token)
	s.mu.Unlock()
	close(h.done)
}

// holdOf returns the hold of the reservation under token, if this Store is
// making or holds it.
func (s *Store) holdOf(token string) *hold {
	if token == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holds[token]
}

// record returns a copy of the record the holder completed, or nil.
func (h *hold) record() *idempotency.Record {
	if h.rec == nil {
		return nil
	}
	return cloneRecord(h.rec)
}

// lookSeq numbers the latest look started.
func (s *Store) lookSeq() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.looks
}

// cloneRecord returns a copy of rec that shares nothing with it.
func cloneRecord(rec *idempotency.Record) *idempotency.Record {
	c := *rec
	c.Header = rec.Header.Clone()
	c.Body = append([]byte{}, rec.Body...)
	return &c
}

// lookResult is what one run of the reservation script found, for the
// callers that joined it.
type lookResult struct {
	done   chan struct{} // closed once out and err are set
	out    tryResult     // out.rec, if any, is the callers' to copy, never to change
	err    error
	leader string // the token the script ran with
	n      int    // callers that joined; guarded by Store.mu
}

// look runs the reservation script for r under own's token, unless another
// caller of this Store is running it for the same key: then it waits for
// that answer and uses it when it can (the key held by that caller, or a
// completed record that has not expired on r's clock); otherwise it runs
// the script itself. Concurrent callers of one key thus cost one round
// trip, not one each. A look numbered after or lower started before what
// the caller waits to see (its subscription, a wake-up), and may have run
// before it: the caller does not join it.
func (s *Store) look(ctx context.Context, k keys, r idempotency.Reservation, own *hold, after uint64) (tryResult, error) {
	s.mu.Lock()
	l := s.looking[k.rec]
	if l != nil && l.seq <= after {
		s.mu.Unlock()
		return s.try(ctx, k, r, own.token)
	}
	if l == nil {
		s.looks++
		own.seq = s.looks
		s.looking[k.rec] = own
		s.mu.Unlock()
		out, err := s.try(ctx, k, r, own.token)
		s.mu.Lock()
		delete(s.looking, k.rec)
		j := own.joined
		own.joined = nil
		s.mu.Unlock()
		if j != nil {
			j.out, j.err = out, err
			if out.rec != nil {
				j.out.rec = cloneRecord(out.rec) // the caller may change its own
			}
			close(j.done)
		}
		return out, err
	}
	j := l.joined
	if j == nil {
		j = &lookResult{done: make(chan struct{}), leader: l.token}
		l.joined = j
	}
	j.n++
	s.mu.Unlock()
	select {
	case <-j.done:
	case <-ctx.Done():
		return tryResult{}, ctx.Err()
	}
	switch out := j.out; {
	case j.err != nil:
		// The other caller failed (its own context may have ended): look
		// ourselves.
	case out.reserved:
		return tryResult{pttl: -1, owner: j.leader}, nil
	case out.rec != nil:
		if out.rec.Key == r.Key && out.rec.ExpiresAt.UnixMilli() > r.Now.UnixMilli() {
			return tryResult{rec: cloneRecord(out.rec)}, nil
		}
	default:
		return out, nil // pending: held by someone else
	}
	return s.try(ctx, k, r, own.token)
}

// wait returns when the local holder h ends (with its record if it
// completed), after a message on w's channel (or a resubscription after a
// reconnect, which may have lost one), after d, or with ctx's error. Either
// h or w may be nil.
func wait(ctx context.Context, h *hold, w *waiter, d time.Duration) (*idempotency.Record, error) {
	var done <-chan struct{}
	if h != nil {
		h.waiters.Add(1)
		defer h.waiters.Add(-1)
		done = h.done
	}
	var msgs <-chan any
	if w != nil {
		msgs = w.msgs
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return h.record(), nil
	case _, ok := <-msgs:
		if !ok {
			w.msgs = nil // closed with the client: rely on the timer
		}
		return nil, nil
	case <-t.C:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// tryResult is what one run of the reservation script found.
type tryResult struct {
	reserved bool
	rec      *idempotency.Record
	pttl     time.Duration // pending: time left on the holder's lease, < 0 if unknown
	owner    string        // pending: the holder's token
}

func (s *Store) try(ctx context.Context, k keys, r idempotency.Reservation, token string) (tryResult, error) {
	vals, err := s.reserveScript.Run(ctx, s.client, []string{k.rec},
		token, r.Key.Scope, r.Key.ID, r.Fingerprint,
		r.Now.UnixMilli(), r.ExpiresAt.UnixMilli(), s.lease.Milliseconds()).Slice()
	if err != nil {
		return tryResult{}, mapErr("reserve", err)
	}
	str := func(i int) string {
		if i < len(vals) {
			if v, ok := vals[i].(string); ok {
				return v
			}
		}
		return ""
	}
	switch str(0) {
	case "reserved":
		return tryResult{reserved: true}, nil
	case "pending":
		ms, err := strconv.ParseInt(str(1), 10, 64)
		if err != nil || ms < 0 {
			ms = -1
		}
		return tryResult{pttl: time.Duration(ms) * time.Millisecond, owner: str(2)}, nil
	case "completed":
		rec, err := decodeRecord(str(1), str(2), str(3), str(4), str(5), str(6), str(7), str(8))
		if err != nil {
			return tryResult{}, fmt.Errorf("redis: record %s: %w", k.rec, err)
		}
		if rec.Key != r.Key {
			return tryResult{}, fmt.Errorf("redis: record %s holds key %q/%q, not %q/%q", k.rec, rec.Key.Scope, rec.Key.ID, r.Key.Scope, r.Key.ID)
		}
		return tryResult{rec: rec}, nil
	}
	return tryResult{}, fmt.Errorf("redis: unexpected reply %v from the reservation script", vals)
}

// waiter is a subscription to one key's wake-up channel.
type waiter struct {
	ps   *goredis.PubSub
	msgs <-chan any
}

// subscribe subscribes to channel and waits (at most d) until Redis has
// confirmed the subscription.
func (s *Store) subscribe(ctx context.Context, channel string, d time.Duration) (*waiter, error) {
	ps := s.client.Subscribe(ctx, channel)
	w := &waiter{ps: ps, msgs: ps.ChannelWithSubscriptions()}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case m, ok := <-w.msgs:
			if !ok {
				w.msgs = nil
				return w, nil
			}
			if _, ok := m.(*goredis.Subscription); ok {
				return w, nil
			}
		case <-t.C:
			return w, nil // unconfirmed: the caller looks again and polls
		case <-ctx.Done():
			w.close()
			return nil, ctx.Err()
		}
	}
}

func (w *waiter) close() {
	if w != nil {
		_ = w.ps.Close()
	}
}

// Purge implements [idempotency.KeyStore]. Completed records carry a Redis
// expiry and vanish by themselves, so Purge deletes nothing and returns 0.
func (s *Store) Purge(ctx context.Context, before time.Time, limit int) (int, error) {
	return 0, ctx.Err()
}

// mapErr is the one place that classifies go-redis errors: replies that a
// retry of the whole attempt can cure wrap [idempotency.ErrConflict];
// everything else (connection errors and timeouts included) is returned as
// it is, so that Do fails closed.
func mapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, goredis.TxFailedErr) {
		return fmt.Errorf("%w: redis %s: %w", idempotency.ErrConflict, op, err)
	}
	var rerr goredis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		for _, p := range []string{"BUSY ", "LOADING ", "TRYAGAIN ", "CLUSTERDOWN ", "MASTERDOWN ", "READONLY "} {
			if strings.HasPrefix(msg, p) {
				return fmt.Errorf("%w: redis %s: %w", idempotency.ErrConflict, op, err)
			}
		}
	}
	return fmt.Errorf("redis %s: %w", op, err)
}
