package redis

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency/backend"
	goredis "github.com/redis/go-redis/v9"
)

var _ backend.QuotaCounter = (*Store)(nil)

// The counters of one scope and window length live in one hash,
// prefix + "quota:{" + a hash of the scope + "}:" + the length in ms, with
// three fields per window: start..":k" (keys counted), start..":f" (in
// flight), start..":b" (bytes stored), start in Unix ms. A check that opens
// a new window deletes the fields of the others, and every check sets the
// hash to expire when its window ends: a scope keeps one window's fields,
// and an idle scope none.

// quotaLua checks a key against the quota: KEYS[1] is the counters' hash,
// KEYS[2] (when given) the key's record. ARGV: the clock (see nowLua), the
// window's length in ms, the limits (keys, in flight, bytes; MaxInt64 for
// none, which a double compares well enough). Returns {"replay"} for a
// completed live record, else {"checked", start, verdict, ms left}.
var quotaLua = nowLua(1) + `if KEYS[2] then
  local r = redis.call('HMGET', KEYS[2], 'state', 'expires')
  if r[1] == 'completed' and tonumber(r[2]) > now then return {'replay'} end
end
local span = tonumber(ARGV[2])
local start = now - ((now % span) + span) % span
local w = string.format('%.0f', start)
local c = redis.call('HMGET', KEYS[1], w .. ':k', w .. ':f', w .. ':b')
if not c[1] then
  local old = redis.call('HKEYS', KEYS[1])
  if #old > 0 then redis.call('HDEL', KEYS[1], unpack(old)) end
end
local keys, flight, bytes = tonumber(c[1] or '0'), tonumber(c[2] or '0'), tonumber(c[3] or '0')
local verdict = 0
if keys >= tonumber(ARGV[3]) then verdict = 1
elseif flight >= tonumber(ARGV[4]) then verdict = 2
elseif bytes >= tonumber(ARGV[5]) then verdict = 3 end
if verdict == 0 then
  redis.call('HINCRBY', KEYS[1], w .. ':k', 1)
  redis.call('HINCRBY', KEYS[1], w .. ':f', 1)
  redis.call('HINCRBY', KEYS[1], w .. ':b', 0)
  redis.call('PEXPIRE', KEYS[1], start + span - now)
end
return {'checked', w, verdict, start + span - now}
`

// quotaEndLua ends an admission: KEYS[1] the counters' hash; ARGV the
// window's start (ms, as quotaLua named it), 1 if the key was not created,
// the bytes stored. A window whose fields are gone is left alone.
const quotaEndLua = `local f = ARGV[1] .. ':f'
if redis.call('HEXISTS', KEYS[1], f) == 0 then return 0 end
if redis.call('HINCRBY', KEYS[1], f, -1) < 0 then redis.call('HSET', KEYS[1], f, 0) end
if ARGV[2] == '1' then
  local k = ARGV[1] .. ':k'
  if redis.call('HINCRBY', KEYS[1], k, -1) < 0 then redis.call('HSET', KEYS[1], k, 0) end
end
redis.call('HINCRBY', KEYS[1], ARGV[1] .. ':b', ARGV[3])
return 1
`

// completedLua reports 1 when KEYS[1], a record, is completed and live by
// the clock in ARGV[1]: the first of the two steps of a check on Redis
// Cluster.
var completedLua = nowLua(1) + `local r = redis.call('HMGET', KEYS[1], 'state', 'expires')
if r[1] == 'completed' and tonumber(r[2]) > now then return 1 end
return 0
`

// quotaKey names the counters of scope for windows of span.
func (s *Store) quotaKey(scope string, span time.Duration) string {
	sum := sha256.Sum256([]byte(scope))
	return s.prefix + "quota:{" + hex.EncodeToString(sum[:16]) + "}:" + strconv.FormatInt(span.Milliseconds(), 10)
}

// sharedSlot reports whether every key of the Store is in one slot: the
// client is not a Cluster client, or the prefix carries a hash tag.
func (s *Store) sharedSlot() bool {
	return s.cluster == nil || strings.Contains(s.prefix, "{")
}

// AdmitQuota implements [backend.QuotaCounter] in one script, which
// reads the key's record and updates the scope's counters atomically. On
// Redis Cluster with a prefix without a hash tag, the record and the
// counters are in different slots: the check is then two scripts, one on
// each node, the record's first. A key completed between the two is
// counted (and given back when its request ends) or refused with the rest.
func (s *Store) AdmitQuota(ctx context.Context, q backend.QuotaCheck) (backend.QuotaAdmission, error) {
	now, err := s.testNow()
	if err != nil {
		return backend.QuotaAdmission{}, err
	}
	keys := []string{s.quotaKey(q.Key.Scope, q.Quota.Window), s.keysFor(q.Key).rec}
	if !s.sharedSlot() {
		done, err := goredis.NewScript(completedLua).Run(ctx, s.client, keys[1:], now).Int64()
		if err != nil {
			return backend.QuotaAdmission{}, mapError(fmt.Sprintf("admit quota of key %v", q.Key), err)
		}
		if done == 1 {
			return backend.QuotaAdmission{Replay: true}, nil
		}
		keys = keys[:1]
	}
	maxKeys, maxInFlight, maxBytes := q.Quota.Limits()
	vals, err := goredis.NewScript(quotaLua).Run(ctx, s.client, keys, now, q.Quota.Window.Milliseconds(),
		maxKeys, maxInFlight, maxBytes).Slice()
	if err != nil {
		return backend.QuotaAdmission{}, mapError(fmt.Sprintf("admit quota of key %v", q.Key), err)
	}
	if len(vals) == 1 && vals[0] == "replay" {
		return backend.QuotaAdmission{Replay: true}, nil
	}
	if len(vals) != 4 {
		return backend.QuotaAdmission{}, fmt.Errorf("redis: admit quota of key %v: unexpected reply %v", q.Key, vals)
	}
	start, err1 := strconv.ParseInt(fmt.Sprint(vals[1]), 10, 64)
	verdict, ok2 := vals[2].(int64)
	left, ok3 := vals[3].(int64)
	if err1 != nil || !ok2 || !ok3 {
		return backend.QuotaAdmission{}, fmt.Errorf("redis: admit quota of key %v: unexpected reply %v", q.Key, vals)
	}
	return backend.QuotaAdmission{
		Counted:     verdict == 0,
		Over:        backend.QuotaLimit(verdict),
		WindowStart: time.UnixMilli(start),
		RetryAfter:  time.Duration(left) * time.Millisecond,
	}, nil
}

// EndQuota implements [backend.QuotaCounter] in one script.
func (s *Store) EndQuota(ctx context.Context, e backend.QuotaEnd) error {
	uncount := "1"
	if e.Created {
		uncount = "0"
	}
	err := goredis.NewScript(quotaEndLua).Run(ctx, s.client, []string{s.quotaKey(e.Scope, e.Window)},
		strconv.FormatInt(e.WindowStart.UnixMilli(), 10), uncount, e.Bytes).Err()
	if err != nil {
		return mapError("end quota", err)
	}
	return nil
}

// PurgeQuota implements [backend.QuotaCounter]: the counters expire by
// themselves when their window ends, so it deletes nothing and returns 0.
func (s *Store) PurgeQuota(ctx context.Context, _ int) (int, error) {
	return 0, ctx.Err()
}
