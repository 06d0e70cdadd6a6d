package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency/redis"
)

// redisNote states the limit of the Redis store under the table.
const redisNote = "Redis: the key and an effect in another store are never committed together; " +
	"effects here are queued on the Redis transaction (the payments are entries of a Redis list), so they commit with the key. " +
	"See the redis package doc and README."

// openRedis wires the Redis store under a key prefix unique to this run
// (one hash tag, so one Cluster slot).
func openRedis(ctx context.Context, opt *goredis.Options, naiveConns int) (b *backend, err error) {
	client, err := openClient(ctx, opt, poolSize)
	if err != nil {
		return nil, err
	}
	naiveClient, err := openClient(ctx, opt, naiveConns)
	if err != nil {
		return nil, errors.Join(err, client.Close())
	}
	prefix := "idemcheck:{" + randomID()[:8] + "}:"
	closeAll := func(ctx context.Context) error {
		var errs []error
		iter := client.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			if err := client.Del(ctx, iter.Val()).Err(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := iter.Err(); err != nil {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			err = fmt.Errorf("redis: delete keys %s*: %w", prefix, err)
			return errors.Join(err, naiveClient.Close(), client.Close())
		}
		return errors.Join(naiveClient.Close(), client.Close())
	}
	store, err := redis.New(client, &redis.Config{Prefix: prefix + "keys:"})
	if err != nil {
		return nil, errors.Join(err, naiveClient.Close(), client.Close())
	}

	naiveKeys := prefix + "naive:key:"
	payments := func(source string) string { return prefix + "payments:" + source }
	naive := naiveOps{
		lookup: func(ctx context.Context, key string) (int, []byte, bool, error) {
			v, err := naiveClient.Get(ctx, naiveKeys+key).Result()
			if errors.Is(err, goredis.Nil) {
				return 0, nil, false, nil
			}
			if err != nil {
				return 0, nil, false, err
			}
			s, body, _ := strings.Cut(v, " ")
			status, err := strconv.Atoi(s)
			return status, []byte(body), err == nil, err
		},
		pay: func(ctx context.Context, orderID, amount int) (string, error) {
			id := randomID()
			return id, naiveClient.RPush(ctx, payments("naive"), id).Err()
		},
		save: func(ctx context.Context, key string, status int, body []byte) error {
			return naiveClient.Set(ctx, naiveKeys+key, strconv.Itoa(status)+" "+string(body), 0).Err()
		},
	}
	// The effect is queued on the Redis transaction: it runs in the
	// MULTI/EXEC that completes the key.
	pay := func(ctx context.Context, tx *redis.Tx, orderID, amount int) (string, error) {
		id := randomID()
		return id, tx.RPush(ctx, payments("library"), id).Err()
	}
	paymentIDs := func(source string) func(context.Context) ([]string, error) {
		return func(ctx context.Context) ([]string, error) {
			return client.LRange(ctx, payments(source), 0, -1).Result()
		}
	}
	return &backend{
		name:  "redis",
		where: fmt.Sprintf("Redis %s db %d", opt.Addr, opt.DB),
		note:  redisNote,
		naive: func(ctx context.Context, n int) (outcome, error) {
			return runNaive(ctx, naive, n, paymentIDs("naive"))
		},
		library: func(ctx context.Context, n int) (outcome, error) {
			return runLibrary[*redis.Tx](ctx, store, pay, n, paymentIDs("library"))
		},
		close: closeAll,
	}, nil
}

// openClient opens a client with a pool of size connections, all of them
// opened now (as in a running server) so that no caller waits for a dial.
func openClient(ctx context.Context, opt *goredis.Options, size int) (*goredis.Client, error) {
	o := *opt
	o.PoolSize = size
	o.MaxIdleConns = size
	client := goredis.NewClient(&o)
	conns := make([]*goredis.Conn, 0, size)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range size {
		c := client.Conn()
		conns = append(conns, c)
		if err := c.Ping(ctx).Err(); err != nil {
			return nil, errors.Join(fmt.Errorf("redis: %w", err), client.Close())
		}
	}
	return client, nil
}
