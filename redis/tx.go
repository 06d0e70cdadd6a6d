package redis

import (
	"context"
	"errors"
	"slices"

	goredis "github.com/redis/go-redis/v9"
)

// Tx is the transaction fn receives: a Redis pipeline. Its commands are
// sent in the same MULTI/EXEC as the stored response when the key
// completes, and only if the caller still owns the key. Nothing queued on it
// runs before that; results are in the commands after [idempotency.Guard.Do]
// returns. If fn fails, the queued commands are discarded.
//
// On Redis Cluster every key fn touches must be in the record's hash slot:
// name keys with [Tx.Key] (or use a prefix with a hash tag, see the package
// doc). Exec refuses to run; Pipelined and TxPipelined only queue. Never
// call Exec on the embedded Pipeliner itself: that would send the commands
// at once, outside the key's transaction.
type Tx struct {
	goredis.Pipeliner
	base string
}

// errExec is returned by the Exec of a [Tx].
var errExec = errors.New("redis: Tx.Exec called inside fn; the commands run when the key completes")

// Key returns a key named name in the record's hash slot, so that fn may use
// it in the transaction on Redis Cluster too. The same name under another
// idempotency key gives another Redis key.
func (tx *Tx) Key(name string) string { return tx.base + "u:" + name }

// Exec refuses to execute: the queued commands run when the key completes.
func (tx *Tx) Exec(ctx context.Context) ([]goredis.Cmder, error) { return nil, errExec }

// Pipelined queues the commands fn queues on tx; they run when the key
// completes. It returns them unexecuted.
func (tx *Tx) Pipelined(ctx context.Context, fn func(goredis.Pipeliner) error) ([]goredis.Cmder, error) {
	n := tx.Len()
	if err := fn(tx); err != nil {
		return nil, err
	}
	return slices.Clone(tx.Cmds()[n:]), nil
}

// TxPipelined is [Tx.Pipelined]: everything on tx is one transaction.
func (tx *Tx) TxPipelined(ctx context.Context, fn func(goredis.Pipeliner) error) ([]goredis.Cmder, error) {
	return tx.Pipelined(ctx, fn)
}

// Pipeline returns tx itself.
func (tx *Tx) Pipeline() goredis.Pipeliner { return tx }

// TxPipeline returns tx itself.
func (tx *Tx) TxPipeline() goredis.Pipeliner { return tx }
