package redis

import (
	"errors"
	"fmt"
	"strings"

	"github.com/go-idempotency/idempotency/backend"
	goredis "github.com/redis/go-redis/v9"
)

// Prefixes of the Redis error replies that a retry of the whole attempt can
// cure: the server is busy, loading, failing over or resharding.
const (
	errBusy        = "BUSY "        // a script or function runs past its time limit
	errLoading     = "LOADING "     // the server is loading its data set
	errTryAgain    = "TRYAGAIN "    // Cluster: a slot is being migrated
	errClusterDown = "CLUSTERDOWN " // Cluster: the cluster cannot serve the slot
	errMasterDown  = "MASTERDOWN "  // a replica lost its link to the primary
	errReadOnly    = "READONLY "    // a replica (a primary just demoted) refuses writes
	errAsk         = "ASK "         // Cluster: the key is on the node importing its slot
	errMoved       = "MOVED "       // Cluster: the slot has another owner
)

// retryable lists the prefixes that [mapError] wraps with
// [backend.ErrConflict].
var retryable = [...]string{errBusy, errLoading, errTryAgain, errClusterDown, errMasterDown, errReadOnly, errAsk, errMoved}

// mapError is the one place that classifies go-redis errors. An aborted
// EXEC (a watched key changed) and the replies listed in retryable wrap
// [backend.ErrConflict]. Everything else, connection errors and
// timeouts included, is returned wrapped as it is, so that Do fails closed.
func mapError(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, goredis.TxFailedErr) {
		return fmt.Errorf("%w: redis %s: %w", backend.ErrConflict, op, err)
	}
	var rerr goredis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		for _, p := range retryable {
			if strings.HasPrefix(msg, p) {
				return fmt.Errorf("%w: redis %s: %w", backend.ErrConflict, op, err)
			}
		}
	}
	return fmt.Errorf("redis %s: %w", op, err)
}

// outcomeUnknown reports whether a command that failed with err may still
// have run on the server. It is false for an error reply of the server (it
// answered), and when go-redis got no connection to send it on. It is true
// for anything else: a cut connection, a timeout, a context that ended
// while the reply was awaited.
func outcomeUnknown(err error) bool {
	var rerr goredis.Error
	return !errors.As(err, &rerr) && !errors.Is(err, goredis.ErrPoolTimeout) && !errors.Is(err, goredis.ErrClosed)
}

// notSent reports whether a transaction that failed with err surely did
// not run. Either the server answered with an error (MULTI refused,
// EXECABORT). Or go-redis refused to use the connection before writing: a
// connection that an earlier command found broken.
func notSent(err error) bool {
	return !outcomeUnknown(err) || strings.HasPrefix(err.Error(), "redis: Conn is in a bad state")
}
