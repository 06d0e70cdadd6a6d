package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// DefaultReplicaTimeout is how long a completion waits for replicas when
// [Config.WaitReplicas] is set and [Config.ReplicaTimeout] is zero.
const DefaultReplicaTimeout = time.Second

// ErrNotReplicated is returned, wrapped, by [idempotency.Guard.Do] when
// [Config.WaitReplicas] is set and fewer replicas than that acknowledged a
// completion within [Config.ReplicaTimeout] (or the WAIT failed). The
// completion was applied on the primary: the key, its response and what fn
// queued are there, and a retry on that primary replays them. But the
// answer was not given, because a failover before the replicas catch up
// would lose them and a retry on the promoted replica would run fn again.
// A replay is refused with it too when the completed record it read is not
// yet on enough replicas (see [Config].WaitReplicas).
var ErrNotReplicated = errors.New("redis: completion not acknowledged by enough replicas")

// replication is what [Config.WaitReplicas] and [Config.ReplicaTimeout]
// ask for, validated.
type replication struct {
	replicas int
	timeout  time.Duration
}

// newReplication validates the replication fields of c.
func newReplication(c Config) (replication, error) {
	switch {
	case c.WaitReplicas < 0:
		return replication{}, fmt.Errorf("%w: redis WaitReplicas %d is negative", idempotency.ErrInvalidConfig, c.WaitReplicas)
	case c.ReplicaTimeout < 0:
		return replication{}, fmt.Errorf("%w: redis ReplicaTimeout %v is negative", idempotency.ErrInvalidConfig, c.ReplicaTimeout)
	case c.ReplicaTimeout > 0 && c.ReplicaTimeout < time.Millisecond:
		return replication{}, fmt.Errorf("%w: redis ReplicaTimeout %v is under 1ms (WAIT counts whole milliseconds; 0 would wait forever)",
			idempotency.ErrInvalidConfig, c.ReplicaTimeout)
	}
	r := replication{replicas: c.WaitReplicas, timeout: c.ReplicaTimeout}
	if r.timeout == 0 {
		r.timeout = DefaultReplicaTimeout
	}
	return r, nil
}

// waitReplicas runs WAIT on tx's connection, the one whose EXEC completed
// the key (WAIT counts the replicas that acknowledged this connection's
// last write), when replicas are required. Fewer acknowledgements than
// required, or a failed WAIT, give an error wrapping [ErrNotReplicated].
func (r replication) waitReplicas(ctx context.Context, tx execConn, key idempotency.Key) error {
	return r.wait(ctx, tx, key, "its completion")
}

// replicaWaiter is a connection WAIT can run on.
type replicaWaiter interface {
	Wait(ctx context.Context, numReplicas int, timeout time.Duration) *goredis.IntCmd
}

// replayReplicated is waitReplicas for a completed record read for a
// replay, on the connection that read it. Redis's WAIT counts the replicas
// that acknowledged the connection's own last write, and a read writes
// nothing; so the read wrote something of its own after it (the
// reservation script's mark, or confirmLua), which the replication stream
// carries after the completion it read. Once n replicas acknowledged that
// write, they have the record too. Fewer: an error wrapping
// [ErrNotReplicated], and the record is not answered.
func (r replication) replayReplicated(ctx context.Context, c replicaWaiter, key idempotency.Key) error {
	return r.wait(ctx, c, key, "the completed record read for a replay")
}

func (r replication) wait(ctx context.Context, c replicaWaiter, key idempotency.Key, what string) error {
	if r.replicas == 0 {
		return nil
	}
	n, err := c.Wait(ctx, r.replicas, r.timeout).Result()
	if err != nil {
		return fmt.Errorf("%w: key %v: WAIT %d %v for %s: %w", ErrNotReplicated, key, r.replicas, r.timeout, what, err)
	}
	if n < int64(r.replicas) {
		return fmt.Errorf("%w: key %v: %d of %d replicas acknowledged %s within %v",
			ErrNotReplicated, key, n, r.replicas, what, r.timeout)
	}
	return nil
}

// tryReplicated is try on a single node or Sentinel client when replicas
// are required: the reservation script runs on a connection of its own,
// and a completed record it returns is answered only once WAIT on that
// connection counted the replicas (see replayReplicated).
func (s *Store) tryReplicated(ctx context.Context, k keys, r backend.Reservation, token, dead string) (tryResult, error) {
	args, err := s.reserveArgs(r, token, dead)
	if err != nil {
		return tryResult{}, err
	}
	cn, err := s.pin(ctx)
	if err != nil {
		return tryResult{}, mapError("reserve", err)
	}
	sent := time.Now()
	vals, err := s.reserveScript.Run(ctx, cn.tx, []string{k.rec}, args...).Slice()
	if err != nil {
		cn.release()
		if outcomeUnknown(err) {
			s.abandon(ctx, k, token)
		}
		return tryResult{}, mapError("reserve", err)
	}
	out, err := s.parseReserve(k, r, vals, sent)
	if err == nil && out.rec != nil {
		err = s.repl.replayReplicated(ctx, cn.tx, r.Key)
	}
	cn.release()
	return out, err
}

// confirmLua writes the record's state again (the same value) if it is
// completed: a write of the caller's own for WAIT to count (see
// replayReplicated), on Redis Cluster, where the reservation script runs
// through the cluster client's pool. KEYS[1] record. Returns 1 if the
// record is completed, else 0.
const confirmLua = `
if redis.call('HGET', KEYS[1], 'state') == 'completed' then
  redis.call('HSET', KEYS[1], 'state', 'completed')
  return 1
end
return 0
`

// confirmReplicated is replayReplicated for the clients that run the
// reservation script through their pool (Cluster, Ring): confirmLua then
// WAIT, on one connection of the node that has the record's slot (on
// Cluster, of its master as the client knows it). A record that node does
// not have (a slot moving) is not answered either.
func (s *Store) confirmReplicated(ctx context.Context, k keys, key idempotency.Key) error {
	if s.repl.replicas == 0 {
		return nil
	}
	confirm := func(tx *goredis.Tx) error {
		n, err := tx.Eval(ctx, confirmLua, []string{k.rec}).Int()
		switch {
		case err != nil:
			return fmt.Errorf("%w: key %v: mark its completed record: %w", ErrNotReplicated, key, err)
		case n != 1:
			return fmt.Errorf("%w: key %v: its completed record is not on the node of its slot", ErrNotReplicated, key)
		}
		return s.repl.replayReplicated(ctx, tx, key)
	}
	if s.cluster == nil {
		// A Ring: Watch picks the shard of the record, on one connection.
		err := s.client.Watch(ctx, confirm, k.rec)
		if err != nil && !errors.Is(err, ErrNotReplicated) {
			err = fmt.Errorf("%w: key %v: %w", ErrNotReplicated, key, err)
		}
		return err
	}
	node, err := s.cluster.MasterForKey(ctx, k.rec)
	if err != nil {
		return fmt.Errorf("%w: key %v: the master of its slot: %w", ErrNotReplicated, key, err)
	}
	return node.Watch(ctx, confirm)
}
