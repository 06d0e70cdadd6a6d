package redis

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// Reserve implements [idempotency.KeyStore]. One call of the reservation
// script (a single round trip) reserves a free key or returns a completed
// record. A key this Store lately saw completed is read first with plain
// commands (HMGET and TIME, one round trip; see lookup), which cost Redis
// a fraction of a script.
//
// A caller that finds the key pending waits, as the package doc describes.
// For a holder in this Store, it waits on the holder itself. For any other,
// it waits on the key's wake-up channel, subscribed before it looks again.
//
// A key may be pending under a token of this Store whose reservation is
// over: its script's reply was lost, or its release failed. Such a key is
// taken over at once, with or without r.Wait. No caller waits out the lease
// of an owner that this Store knows is gone. The reservation script of a caller whose reply
// is lost is abandoned before Reserve returns (see abandon).
func (s *Store) Reserve(ctx context.Context, r backend.Reservation) (backend.Txn[*Tx], *backend.Record, error) {
	k := s.keysFor(r.Key)
	if s.single != nil && s.repl.replicas == 0 && s.seen.has(k.id) {
		// A key this Store lately saw completed: a plain read first, with
		// no token nor hold to make.
		out, err := s.lookup(ctx, k, r)
		if err != nil || out.rec != nil {
			return nil, out.rec, err
		}
		// No longer completed (expired, forgotten): reserve.
	}
	token := s.tokens + rand.Text()
	var deadline time.Time
	if r.Wait > 0 {
		deadline = time.Now().Add(r.Wait)
	}
	// Known before the script can reserve, so that this Store's waiters
	// find the holder as soon as Redis names it.
	own := s.addHold(token)
	var w *waiter
	var dead string // a token of this Store, over, that Redis still names
	defer func() {
		w.close()
		if own != nil {
			s.endHold(own)
		}
	}()
	for {
		out, err := s.try(ctx, k, r, own.token, dead)
		if err != nil {
			return nil, nil, err
		}
		switch {
		case out.rec != nil:
			s.seen.add(k.id)
			return nil, out.rec, nil
		case out.reserved:
			t := s.newTxn(k, r, own, out)
			own = nil
			return t, nil, nil
		}
		h := s.holdOf(out.owner)
		if h == nil && out.owner != dead && strings.HasPrefix(out.owner, s.tokens) {
			// The holder was this Store's and is over: take the key over
			// from its token (the script does it only if Redis still names
			// that token).
			dead = out.owner
			continue
		}
		remaining := time.Until(deadline)
		if r.Wait <= 0 || remaining <= 0 {
			return nil, nil, fmt.Errorf("%w: key %v", idempotency.ErrInProgress, r.Key)
		}
		if h == nil && w == nil {
			// Subscribe, then look again: a completion after that look
			// publishes to a live subscription.
			if w, err = s.subscribe(ctx, k.wake(), remaining); err != nil {
				return nil, nil, fmt.Errorf("%w: waiting for key %v: %w", idempotency.ErrInProgress, r.Key, err)
			}
			continue
		}
		d := min(remaining, s.poll)
		if out.pttl >= 0 {
			d = min(d, out.pttl+time.Millisecond)
		}
		s.waiting.Add(1)
		rec, err := wait(ctx, h, w, d)
		s.waiting.Add(-1)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: waiting for key %v: %w", idempotency.ErrInProgress, r.Key, err)
		}
		if rec != nil && rec.Key == r.Key && s.liveInMemory(rec, h.until) {
			s.seen.add(k.id)
			return nil, rec, nil
		}
	}
}

// tryResult is what one run of the reservation script found.
type tryResult struct {
	reserved bool
	rec      *backend.Record
	pttl     time.Duration // pending: time left on the holder's lease, < 0 if unknown
	until    time.Time     // completed: the monotonic instant rec expires, by Redis's clock when it was read
	owner    string        // pending: the holder's token
	// reserved: the reservation's creation time and Redis's clock when the
	// script ran (Unix ms; see completionClock), read at clockAt.
	created, clock int64
	clockAt        time.Time
	// reserved on a connection of its own, with WATCH armed on the record
	// (see tryWatched); nil otherwise.
	conn *pinned
}

// reserveArgs are the reservation script's ARGV: the clock is Redis's
// (TIME in the script) unless a test clock is set.
func (s *Store) reserveArgs(r backend.Reservation, token, dead string) ([]any, error) {
	now, err := s.testNow()
	if err != nil {
		return nil, err
	}
	mark := "" // see reserveLua; Cluster and Ring mark with confirmLua
	if s.repl.replicas > 0 && s.single != nil {
		mark = "1"
	}
	return []any{token, r.Key.Scope, r.Key.ID, r.Fingerprint,
		now, r.TTL.Milliseconds(), s.lease.Milliseconds(), dead, mark}, nil
}

// try runs the reservation script once under token, taking the key over
// from the token dead if Redis still names it. When the outcome is unknown
// (no reply: a cut connection, a timeout, ctx done while the script may
// have run), it abandons token before it returns.
func (s *Store) try(ctx context.Context, k keys, r backend.Reservation, token, dead string) (tryResult, error) {
	if s.single != nil && r.Wait == 0 && dead == "" && !s.seen.has(k.id) {
		return s.tryWatched(ctx, k, r, token)
	}
	if s.single != nil && s.repl.replicas > 0 {
		return s.tryReplicated(ctx, k, r, token, dead)
	}
	args, err := s.reserveArgs(r, token, dead)
	if err != nil {
		return tryResult{}, err
	}
	sent := time.Now()
	vals, err := s.reserveScript.Run(ctx, s.client, []string{k.rec}, args...).Slice()
	if err != nil {
		if outcomeUnknown(err) {
			s.abandon(ctx, k, token)
		}
		return tryResult{}, mapError("reserve", err)
	}
	out, err := s.parseReserve(k, r, vals, sent)
	if err == nil && out.rec != nil {
		// replicas.go: not answered before the replicas have the record.
		err = s.confirmReplicated(ctx, k, r.Key)
	}
	return out, err
}

// parseReserve reads the reply of the reservation script, sent at sent.
func (s *Store) parseReserve(k keys, r backend.Reservation, vals []any, sent time.Time) (tryResult, error) {
	str := func(i int) string { return replyStr(vals, i) }
	switch str(0) {
	case replyReserved:
		created, err1 := strconv.ParseInt(str(1), 10, 64)
		clock, err2 := strconv.ParseInt(str(2), 10, 64)
		if err1 != nil || err2 != nil {
			return tryResult{}, fmt.Errorf("redis: record %s: bad reservation times %q, %q", k.rec, str(1), str(2))
		}
		return tryResult{reserved: true, created: created, clock: clock, clockAt: time.Now()}, nil
	case replyAbandoned:
		return tryResult{}, fmt.Errorf("redis: reservation of key %v already abandoned", r.Key)
	case replyPending:
		ms, err := strconv.ParseInt(str(1), 10, 64)
		if err != nil || ms < 0 {
			ms = -1
		}
		return tryResult{pttl: time.Duration(ms) * time.Millisecond, owner: str(2)}, nil
	case replyCompleted:
		now, err := strconv.ParseInt(str(9), 10, 64)
		if err != nil {
			return tryResult{}, fmt.Errorf("redis: record %s: bad clock %q", k.rec, str(9))
		}
		return completedResult(k, r.Key, str, now, sent)
	}
	return tryResult{}, fmt.Errorf("redis: unexpected reply %v from the reservation script", vals)
}

// abandon deletes the reservation that a script sent under token may have
// made. Or, if the script has not run yet, it marks the token so that the
// script reserves nothing. A retry then finds the key free, not held for a
// lease by an owner that is gone. It is best effort, on a context of its
// own (ctx may be done). If it fails too, the key stays pending under token until its lease
// runs out, except for the callers of this Store, which take it over.
func (s *Store) abandon(ctx context.Context, k keys, token string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
	defer cancel()
	_ = s.abandonScript.Run(ctx, s.client, []string{k.rec},
		token, k.wake(), s.lease.Milliseconds()).Err()
}

// lookupFields are the fields of a completed record that lookup reads, in
// the order decodeRecord takes them after the state.
var lookupFields = []string{"state", "fp", "status", "hdr", "body", "created", "expires", "scope", "id"}

// lookupArgs is the HMGET of lookup, its record's name (index 1) left to
// fill: built once, so that a replay boxes no field name.
var lookupArgs = func() []any {
	args := []any{"hmget", nil}
	for _, f := range lookupFields {
		args = append(args, f)
	}
	return args
}()

// lookup reads the record of a key this Store lately saw completed, with
// plain commands in one round trip: HMGET and Redis's clock (TIME), on a
// single node or Sentinel. It returns the record if it is completed and
// live by that clock (or the test clock), else an empty result: the
// caller then runs the reservation script. A replay so costs Redis a read
// rather than a script.
func (s *Store) lookup(ctx context.Context, k keys, r backend.Reservation) (tryResult, error) {
	sent := time.Now()
	args := slices.Clone(lookupArgs)
	args[1] = k.rec
	fields := goredis.NewSliceCmd(ctx, args...)
	clock := goredis.NewTimeCmd(ctx, "time")
	p := s.single.Pipeline()
	_ = p.BatchProcess(ctx, fields, clock) // only queues: never fails
	_, err := p.Exec(ctx)
	if err != nil {
		return tryResult{}, mapError("reserve", err)
	}
	v := fields.Val()
	str := func(i int) string { return replyStr(v, i) }
	if str(0) != stateCompleted {
		return tryResult{}, nil
	}
	now := clock.Val().UnixMilli()
	if test, set, err := s.testClock(); err != nil {
		return tryResult{}, err
	} else if set {
		now = test
	}
	out, err := completedResult(k, r.Key, str, now, sent)
	if err == nil && !out.until.After(sent) {
		return tryResult{}, nil // expired by that clock
	}
	return out, err
}

// replyStr is v[i] if it is a string, else "".
func replyStr(v []any, i int) string {
	if i < len(v) {
		if s, ok := v[i].(string); ok {
			return s
		}
	}
	return ""
}

// completedResult is the result of finding key's record completed: its
// fields are str(1) to str(8), the order decodeRecord takes, as the
// reservation script and lookup read them in a call sent at sent, when
// Redis's clock (or the test clock) read now, in Unix ms. It is live
// until what that clock left it, counted from sent: never longer than by
// Redis's clock.
func completedResult(k keys, key idempotency.Key, str func(int) string, now int64, sent time.Time) (tryResult, error) {
	rec, err := decodeRecord(str(1), str(2), str(3), str(4), str(5), str(6), str(7), str(8))
	if err != nil {
		return tryResult{}, fmt.Errorf("redis: record %s: %w", k.rec, err)
	}
	if rec.Key != key {
		return tryResult{}, fmt.Errorf("redis: record %s holds key %v, not %v", k.rec, rec.Key, key)
	}
	left := time.Duration(rec.ExpiresAt.UnixMilli()-now) * time.Millisecond
	return tryResult{rec: rec, until: sent.Add(left)}, nil
}
