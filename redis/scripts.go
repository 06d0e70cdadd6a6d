package redis

import "fmt"

// Record fields and states.
const (
	statePending   = "pending"
	stateCompleted = "completed"
	msgCompleted   = "completed"
)

// Replies of the reservation script.
const (
	replyReserved  = "reserved"
	replyPending   = "pending"
	replyCompleted = "completed"
	replyAbandoned = "abandoned"
)

// nowLua sets local now to the clock of a script, in Unix milliseconds:
// the test clock's reading in the ARGV it names, or, when that is "",
// Redis's own clock (TIME; Redis 7 replicates a script's effects, so
// reading it is allowed). Lua numbers are doubles: every millisecond up to
// MaxExpiry (9.2e12) is exact.
func nowLua(argv int) string {
	return fmt.Sprintf(`local now = tonumber(ARGV[%d])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`, argv)
}

// maxExpiryMs is [backend.MaxExpiry] in Unix milliseconds, rounded
// down: the latest expiry a record gets.
const maxExpiryMs = "9223372036854"

// reserveLua takes the key unless a live record holds it.
//
// KEYS[1], the record, is the only key it names. So Redis Cluster runs it on
// whichever node holds the record while its slot migrates. (A script naming
// a second key that does not exist is refused with TRYAGAIN on both nodes
// until the hand-over.)
//
// ARGV:
//   - token, scope, id, fingerprint;
//   - the clock: a test clock's reading in ms, or "" for Redis's (see
//     nowLua);
//   - TTL ms: the provisional expiry is the clock plus it;
//   - lease ms;
//   - a token of this Store whose reservation is over ("" if none). A
//     record pending under it is taken over;
//   - "1" when the caller will WAIT for replicas before it answers a
//     completed record ([Config.WaitReplicas]), else "". The script then
//     writes the record's state again (the same value) when it returns it
//     completed: a write of the caller's own, after the completion in the
//     replication stream, which WAIT on the same connection can count.
//
// A record in state "abandoned" (see abandonLua) is free, except to
// its own token. Returns {"reserved", created, the clock} (created: the
// reservation's creation time, which Complete writes into the completed
// record), {"abandoned"} (the caller already gave this token up),
// {"pending", pttl ms, owner} or {"completed", fingerprint, status,
// header, body, created, expires, scope, id, the clock}.
var reserveLua = nowLua(5) + `local r = redis.call('HMGET', KEYS[1], 'state', 'owner', 'fp', 'status', 'hdr', 'body', 'created', 'expires', 'scope', 'id')
if r[1] == 'abandoned' then
  if r[2] == ARGV[1] then
    return {'abandoned'}
  end
elseif r[1] == 'completed' then
  if tonumber(r[8]) > now then
    if ARGV[9] == '1' then
      redis.call('HSET', KEYS[1], 'state', 'completed')
    end
    return {'completed', r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], string.format('%.0f', now)}
  end
elseif r[1] == 'pending' then
  if r[2] == ARGV[1] then
    return {'reserved', r[7], string.format('%.0f', now)}
  end
  if ARGV[8] == '' or r[2] ~= ARGV[8] then
    return {'pending', tostring(redis.call('PTTL', KEYS[1])), r[2]}
  end
elseif r[1] then
  return redis.error_reply('idempotency: record ' .. KEYS[1] .. ' has unknown state ' .. tostring(r[1]))
end
redis.call('DEL', KEYS[1])
local created = string.format('%.0f', now)
redis.call('HSET', KEYS[1], 'state', 'pending', 'owner', ARGV[1], 'scope', ARGV[2], 'id', ARGV[3],
  'fp', ARGV[4], 'created', created,
  'expires', string.format('%.0f', math.min(now + tonumber(ARGV[6]), ` + maxExpiryMs + `)))
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return {'reserved', created, created}
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

// abandonLua gives up a reservation script whose reply was lost. It
// deletes the reservation if the script made it. Otherwise, if the key is
// free, it leaves a record in state "abandoned" under the token for a
// lease. So the script, if it arrives later, reserves nothing. (Any other
// token takes the key as free.) One key, like reserveLua.
// KEYS[1] record. ARGV: token, channel, lease ms. Returns 1 if it deleted
// a reservation, else 0.
const abandonLua = `
local r = redis.call('HMGET', KEYS[1], 'state', 'owner')
if r[1] == 'pending' and r[2] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
if not r[1] then
  redis.call('HSET', KEYS[1], 'state', 'abandoned', 'owner', ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 0
`
