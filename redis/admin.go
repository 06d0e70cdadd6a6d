package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

var _ backend.KeyAdmin = (*Store)(nil)

// Replies of the administration script (see adminLua).
const (
	replyAbsent = "absent"
	replyHeld   = "held"
	replyFound  = "found"
)

// Modes of the administration script.
const (
	adminInspect     = "inspect"
	adminInspectBody = "body"
	adminForget      = "forget"
)

// adminLua looks at one record, and in mode "forget" deletes it unless it
// is pending (held under a live lease: a pending record exists only while
// its lease runs, Redis deletes it at the lease's end). It names only the
// record, so it runs on the node of the record's slot, like reserveLua.
// The body is read only in mode "body"; its length always (HSTRLEN).
//
// KEYS[1] record. ARGV: the mode, the clock (see nowLua). Returns
// {"absent"} (no record, or an "abandoned" marker, which is no record:
// see abandonLua), {"held"} in mode "forget" for a pending record, or
// {"found", state, fp, status, hdr, created, expires, scope, id, body
// length, lease end, now, body}: times in Unix ms, the lease end by
// Redis's own clock (leases are always Redis's), "" unless pending; body
// false unless asked for.
var adminLua = nowLua(2) + `local r = redis.call('HMGET', KEYS[1], 'state', 'fp', 'status', 'hdr', 'created', 'expires', 'scope', 'id')
if not r[1] or r[1] == 'abandoned' then
  return {'absent'}
end
if r[1] ~= 'pending' and r[1] ~= 'completed' then
  return redis.error_reply('idempotency: record ' .. KEYS[1] .. ' has unknown state ' .. tostring(r[1]))
end
local lease = ''
if r[1] == 'pending' then
  if ARGV[1] == 'forget' then
    return {'held'}
  end
  local t = redis.call('TIME')
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl >= 0 then
    lease = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + pttl)
  end
end
local blen = redis.call('HSTRLEN', KEYS[1], 'body')
local body = false
if ARGV[1] == 'body' then
  body = redis.call('HGET', KEYS[1], 'body')
end
if ARGV[1] == 'forget' then
  redis.call('DEL', KEYS[1])
end
return {'found', r[1], r[2], r[3] or '', r[4] or '', r[5], r[6], r[7], r[8], blen, lease, string.format('%.0f', now), body}
`

// Inspect implements [backend.KeyAdmin]. It reads the record in one
// script (one round trip, no lock): a pending record is [backend.KeyInProgress]
// (a reservation holds it under a live lease), with its fingerprint, its
// creation, its provisional expiry and the end of its lease (LeaseEnds, by
// Redis's clock, as every lease); a completed one is
// [backend.KeyCompleted], or [backend.KeyExpired] once its expiry
// is not after the store's clock (Redis deletes it at least a minute after
// its completion, so an expired record is seen only that long). The body
// is read only when body is true. A key with no record gives an error
// wrapping [idempotency.ErrNotFound].
func (s *Store) Inspect(ctx context.Context, key idempotency.Key, body bool) (*backend.KeyInfo, error) {
	mode := adminInspect
	if body {
		mode = adminInspectBody
	}
	return s.admin(ctx, "inspect", key, mode)
}

// Forget implements [backend.KeyAdmin]. One script checks and deletes
// the record atomically: a pending record (a reservation holds the key
// under a live lease) is refused with [idempotency.ErrInProgress] and left
// as it is; a completed or expired one is deleted and returned, without
// its body. A key with no record gives an error wrapping
// [idempotency.ErrNotFound]. If the reply is lost, the record may be
// deleted or not: asking again says which (ErrNotFound once it is gone).
func (s *Store) Forget(ctx context.Context, key idempotency.Key) (*backend.KeyInfo, error) {
	return s.admin(ctx, "forget", key, adminForget)
}

// admin runs adminLua on key's record in mode and decodes its reply.
func (s *Store) admin(ctx context.Context, op string, key idempotency.Key, mode string) (*backend.KeyInfo, error) {
	now, err := s.testNow()
	if err != nil {
		return nil, err
	}
	k := s.keysFor(key)
	vals, err := s.adminScript.Run(ctx, s.client, []string{k.rec}, mode, now).Slice()
	if err != nil {
		return nil, mapError(op, err)
	}
	str := func(i int) string {
		if i < len(vals) {
			switch v := vals[i].(type) {
			case string:
				return v
			case int64:
				return strconv.FormatInt(v, 10)
			}
		}
		return ""
	}
	switch str(0) {
	case replyAbsent:
		return nil, fmt.Errorf("redis %s: key %v: %w", op, key, idempotency.ErrNotFound)
	case replyHeld:
		return nil, fmt.Errorf("%w: redis %s: key %v is held by a reservation under a live lease", idempotency.ErrInProgress, op, key)
	case replyFound:
	default:
		return nil, fmt.Errorf("redis %s: unexpected reply %v from the administration script", op, vals)
	}
	info, err := decodeInfo(key, str)
	if err != nil {
		return nil, fmt.Errorf("redis %s: record %s: %w", op, k.rec, err)
	}
	if mode == adminInspectBody && info.State != backend.KeyInProgress {
		info.Body = []byte(str(12))
	}
	return info, nil
}

// decodeInfo builds a KeyInfo for key from the fields of a "found" reply
// of adminLua, str(i) being its i-th element.
func decodeInfo(key idempotency.Key, str func(int) string) (*backend.KeyInfo, error) {
	if got := (idempotency.Key{Scope: str(7), ID: str(8)}); got != key {
		return nil, fmt.Errorf("holds key %v, not %v", got, key)
	}
	ms := func(name string, i int) (time.Time, error) {
		if str(i) == "" {
			return time.Time{}, nil
		}
		v, err := strconv.ParseInt(str(i), 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("bad %s %q", name, str(i))
		}
		return time.UnixMilli(v), nil
	}
	var errs []error
	times := make([]time.Time, 4)
	for j, f := range []struct {
		name string
		i    int
	}{{"created", 5}, {"expires", 6}, {"lease end", 10}, {"clock", 11}} {
		var err error
		times[j], err = ms(f.name, f.i)
		errs = append(errs, err)
	}
	blen, err := strconv.Atoi(str(9))
	if err != nil {
		errs = append(errs, fmt.Errorf("bad body length %q", str(9)))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	info := &backend.KeyInfo{Key: key, Fingerprint: str(2), BodyLen: blen,
		CreatedAt: times[0], ExpiresAt: times[1], LeaseEnds: times[2]}
	switch {
	case str(1) == statePending:
		info.State = backend.KeyInProgress
		return info, nil
	case times[1].After(times[3]):
		info.State = backend.KeyCompleted
	default:
		info.State = backend.KeyExpired
	}
	if info.Status, err = strconv.Atoi(str(3)); err != nil {
		return nil, fmt.Errorf("bad status %q", str(3))
	}
	if info.Header, err = backend.UnmarshalHeader([]byte(str(4))); err != nil {
		return nil, fmt.Errorf("bad header: %w", err)
	}
	return info, nil
}
