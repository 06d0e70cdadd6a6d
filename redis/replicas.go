package redis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency"
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
	if r.replicas == 0 {
		return nil
	}
	n, err := tx.Wait(ctx, r.replicas, r.timeout).Result()
	if err != nil {
		return fmt.Errorf("%w: key %v: WAIT %d %v: %w", ErrNotReplicated, key, r.replicas, r.timeout, err)
	}
	if n < int64(r.replicas) {
		return fmt.Errorf("%w: key %v: %d of %d replicas acknowledged its completion within %v",
			ErrNotReplicated, key, n, r.replicas, r.timeout)
	}
	return nil
}
