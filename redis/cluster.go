package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// This file holds Complete's path on Redis Cluster. There a slot can move
// between nodes while a key is held (resharding, slot migration, failover).
//
// go-redis's ClusterClient.Watch cannot be trusted there. It follows an ASK
// by sending WATCH to the importing node without ASKING, and gets MOVED
// back. Once its redirects are used up, it returns nil without having run
// the callback at all. (In v9.23 the error of the last redirect is
// overwritten by the node look-up's nil.) A Complete that took that nil for
// an applied EXEC answered while nothing was stored.
//
// So the Store runs WATCH, the owner check and MULTI/EXEC itself, on one
// connection of the node that holds the record. It sends ASKING before each
// command when that node is importing the slot. It takes for applied only
// an EXEC that returned its replies. Redirects are followed and TRYAGAIN (a multi-key command while
// the slot's keys are split between the nodes) is retried, within a bound.

// errRedirect says a step of the cluster Complete must be tried again, on
// the node the redirect names or after a pause; it never leaves this file.
type errRedirect struct {
	ask, moved bool
	addr       string
	err        error
}

func (e *errRedirect) Error() string { return e.err.Error() }
func (e *errRedirect) Unwrap() error { return e.err }

// redirectOf returns the redirect that err (or, after an aborted EXEC, the
// first of cmds that failed) asks for: ASK, MOVED, TRYAGAIN, or an
// aborted-by-a-redirect EXEC. It returns nil for any other error.
func redirectOf(err error, cmds []goredis.Cmder) *errRedirect {
	if err == nil {
		return nil
	}
	if r := parseRedirect(err); r != nil {
		return r
	}
	if goredis.IsExecAbortError(err) {
		for _, c := range cmds {
			if r := parseRedirect(c.Err()); r != nil {
				return r
			}
		}
	}
	return nil
}

func parseRedirect(err error) *errRedirect {
	var rerr goredis.Error
	if err == nil || !errors.As(err, &rerr) {
		return nil
	}
	msg := rerr.Error()
	f := strings.Fields(msg)
	switch {
	case len(f) == 3 && f[0] == "ASK":
		return &errRedirect{ask: true, addr: f[2], err: err}
	case len(f) == 3 && f[0] == "MOVED":
		return &errRedirect{moved: true, addr: f[2], err: err}
	case strings.HasPrefix(msg, errTryAgain), strings.HasPrefix(msg, errClusterDown):
		return &errRedirect{err: err}
	}
	return nil
}

// errElsewhere says the importing node does not have the record (yet): it
// may still be on the migrating node, and the check must be tried again.
var errElsewhere = errors.New("redis: record not on the importing node yet")

// clusterNode returns the client of the master at addr, reloading the
// slots once if the client does not know it yet.
func (s *Store) clusterNode(ctx context.Context, addr string) (*goredis.Client, error) {
	find := func() *goredis.Client {
		var mu sync.Mutex
		var found *goredis.Client
		// Replicas too: a MOVED after a failover names a replica just
		// promoted, before the client's slot map says so.
		_ = s.cluster.ForEachShard(ctx, func(ctx context.Context, c *goredis.Client) error {
			if c.Options().Addr == addr {
				mu.Lock()
				found = c
				mu.Unlock()
			}
			return nil
		})
		return found
	}
	if c := find(); c != nil {
		return c, nil
	}
	s.cluster.ReloadState(ctx)
	if c := find(); c != nil {
		return c, nil
	}
	return nil, fmt.Errorf("redis: cluster node %s unknown to the client", addr)
}

// askingConn sends ASKING before MULTI, so that the importing node runs
// the whole transaction (the flag lasts until EXEC).
type askingConn struct{ *goredis.Tx }

func (c askingConn) TxPipelined(ctx context.Context, fn func(goredis.Pipeliner) error) ([]goredis.Cmder, error) {
	if err := c.Tx.Do(ctx, "asking").Err(); err != nil {
		return nil, err
	}
	return c.Tx.TxPipelined(ctx, fn)
}

// clusterWatchOwned is watchOwned on Redis Cluster. It WATCHes the record,
// checks it is pending under token, and runs fn (which ends with EXEC). All
// run on one connection of the node that holds the record. It follows ASK
// and MOVED, and retries TRYAGAIN for at most bound. fn reports through sent the
// commands its EXEC carried, so that a redirect on any of them is seen.
func (s *Store) clusterWatchOwned(ctx context.Context, rec, token string, bound time.Duration,
	fn func(execConn) error, sent func() []goredis.Cmder) error {
	deadline := time.Now().Add(bound)
	node, err := s.cluster.MasterForKey(ctx, rec)
	if err != nil {
		return err
	}
	asking := false
	pause := 5 * time.Millisecond
	redirects := 0 // in a row: a redirect loop (stale slot maps) pauses too
	for {
		err := node.Watch(ctx, func(tx *goredis.Tx) error {
			var st *goredis.SliceCmd
			var watch *goredis.Cmd
			_, err := tx.Pipelined(ctx, func(p goredis.Pipeliner) error {
				if asking {
					p.Do(ctx, "asking")
				}
				watch = p.Do(ctx, "watch", rec)
				if asking {
					p.Do(ctx, "asking")
				}
				st = p.HMGet(ctx, rec, "state", "owner")
				return nil
			})
			if err == nil {
				v := st.Val()
				switch {
				case len(v) == 2 && v[0] == statePending && v[1] == token:
					var c execConn = tx
					if asking {
						c = askingConn{tx}
					}
					err = fn(c)
					if r := redirectOf(err, sent()); r != nil {
						err = r
					}
				case asking && len(v) == 2 && v[0] == nil:
					err = errElsewhere
				default:
					err = errNotOwner
				}
			} else if r := redirectOf(err, []goredis.Cmder{watch, st}); r != nil {
				err = r
			}
			if err != nil && !errors.Is(err, goredis.TxFailedErr) && !goredis.IsExecAbortError(err) {
				// WATCH may still be armed (EXEC did not run): clear it
				// before the connection goes back to the pool.
				uctx, cancel := cleanupContext(ctx)
				_ = tx.Unwatch(uctx).Err()
				cancel()
			}
			return err
		})
		var r *errRedirect
		switch {
		case errors.As(err, &r):
		case errors.Is(err, errElsewhere):
			r = &errRedirect{err: err}
		default:
			return err
		}
		if time.Now().After(deadline) {
			return r.err
		}
		if redirects++; (r.moved || r.ask) && redirects <= 4 {
			// A routing change: follow it at once.
			if r.moved {
				s.cluster.ReloadState(ctx)
			}
			if n, err := s.clusterNode(ctx, r.addr); err == nil {
				node, asking = n, r.ask
				continue
			}
			// A node the client does not know yet: after a pause, from the
			// slot's owner in the reloaded map.
		}
		redirects = 0
		// TRYAGAIN, or the record not on the importing node yet: the keys
		// are moving; wait, then start again from the slot's owner.
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 100*time.Millisecond)
		if node, err = s.cluster.MasterForKey(ctx, rec); err != nil {
			return err
		}
		asking = false
	}
}
