package clusters

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency/conformance/faultproxy"
)

// SentinelMaster is the name the Sentinel monitors the primary under.
const SentinelMaster = "ha"

// RedisSet is a Redis primary, a replica that replicates through a
// [faultproxy.Proxy], and one Sentinel (quorum 1) that fails the primary over to the
// replica, all on loopback.
type RedisSet struct {
	// Link carries the replication connection between the replica and
	// the primary: [faultproxy.Proxy.Partition] holds back what the
	// primary sends, as a lagging or partitioned replica would see it.
	Link *faultproxy.Proxy

	t            testing.TB
	dir          string
	primaryPort  int
	replicaPort  int
	sentinelPort int
	primary      *proc
	replica      *proc
	sentinel     *proc
}

// StartRedis starts the primary (no persistence), the replica and a
// Sentinel started with redis-server --sentinel (down-after-milliseconds
// 500). Each listens on a loopback port found free at run time. It waits
// until the replica is in sync and known to the Sentinel. They are
// killed in t.Cleanup.
func StartRedis(t testing.TB) *RedisSet {
	t.Helper()
	bins := need(t, "the Redis failover test", "redis-server")
	dir := tempDir(t, "idem-clusters-redis-")
	r := &RedisSet{t: t, dir: dir, primaryPort: FreePort(t), replicaPort: FreePort(t), sentinelPort: FreePort(t)}
	r.primary = startRedisServer(t, bins[0], dir, "primary", r.primaryPort, "--appendonly", "no")
	waitFor(t, 10*time.Second, "the Redis primary", pingRedis(r.PrimaryAddr()), r.primary)
	var linkPort int
	r.Link, linkPort = replicationLink(t, r.PrimaryAddr())
	r.replica = startRedisServer(t, bins[0], dir, "replica", r.replicaPort, "--appendonly", "no", "--replicaof", "127.0.0.1", strconv.Itoa(linkPort),
		"--replica-announce-ip", "127.0.0.1", "--replica-announce-port", strconv.Itoa(r.replicaPort))
	waitFor(t, 10*time.Second, "the replica to sync", func(ctx context.Context) error {
		info, err := infoOf(ctx, r.ReplicaAddr())
		if err != nil {
			return err
		}
		if !strings.Contains(info, "master_link_status:up") {
			return fmt.Errorf("replica: master link not up")
		}
		return nil
	}, r.primary, r.replica)
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\n"+
		"sentinel monitor %s 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds %s 500\n"+
		"sentinel failover-timeout %s 10000\n"+
		"sentinel parallel-syncs %s 1\n",
		r.sentinelPort, dir, SentinelMaster, r.primaryPort, SentinelMaster, SentinelMaster, SentinelMaster)
	confPath := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	r.sentinel = startProc(t, "redis sentinel", command(account{}, bins[0], confPath, "--sentinel"), filepath.Join(dir, "sentinel.log"))
	waitFor(t, 20*time.Second, "the Sentinel to know the replica", func(ctx context.Context) error {
		s := goredis.NewSentinelClient(&goredis.Options{Addr: r.SentinelAddr()})
		defer s.Close()
		reps, err := s.Replicas(ctx, SentinelMaster).Result()
		if err != nil {
			return err
		}
		for _, rep := range reps {
			if rep["port"] == strconv.Itoa(r.replicaPort) && !strings.Contains(rep["flags"], "down") && rep["master-link-status"] == "ok" {
				return nil
			}
		}
		return fmt.Errorf("sentinel replicas: %v", reps)
	}, r.primary, r.replica, r.sentinel)
	// A Sentinel whose timer ran late (a loaded machine) enters TILT for
	// 30 s and acts on nothing meanwhile. Then it finds its replica's facts
	// too old to promote it: a failover asked for in that time is late by
	// up to a minute. Start the test once it watches normally.
	waitFor(t, 45*time.Second, "the Sentinel out of TILT mode", func(ctx context.Context) error {
		c := goredis.NewClient(&goredis.Options{Addr: r.SentinelAddr()})
		defer c.Close()
		info, err := c.Info(ctx, "sentinel").Result()
		if err != nil {
			return err
		}
		if !strings.Contains(info, "sentinel_tilt:0") {
			return fmt.Errorf("sentinel in TILT mode")
		}
		return nil
	}, r.primary, r.replica, r.sentinel)
	return r
}

// startRedisServer starts redis-server (bin) on a loopback port, without
// RDB snapshots, with its files in dir named after name, and extra
// arguments after the common ones. It is killed in t.Cleanup.
func startRedisServer(t testing.TB, bin, dir, name string, port int, extra ...string) *proc {
	t.Helper()
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--dir", dir, "--dbfilename", name + ".rdb", "--daemonize", "no", "--protected-mode", "no"}, extra...)
	return startProc(t, "redis "+name, command(account{}, bin, args...), filepath.Join(dir, name+".log"))
}

func pingRedis(addr string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		defer c.Close()
		return c.Ping(ctx).Err()
	}
}

func infoOf(ctx context.Context, addr string) (string, error) {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	return c.Info(ctx, "replication").Result()
}

// PrimaryAddr is the primary's address.
func (r *RedisSet) PrimaryAddr() string { return "127.0.0.1:" + strconv.Itoa(r.primaryPort) }

// ReplicaAddr is the replica's address.
func (r *RedisSet) ReplicaAddr() string { return "127.0.0.1:" + strconv.Itoa(r.replicaPort) }

// SentinelAddr is the Sentinel's address.
func (r *RedisSet) SentinelAddr() string { return "127.0.0.1:" + strconv.Itoa(r.sentinelPort) }

// KillPrimary kills the primary with SIGKILL and closes the replication
// link, dropping whatever a partition of the link held back.
func (r *RedisSet) KillPrimary() {
	r.primary.kill()
	_ = r.Link.Close()
}

// AwaitFailover waits until the Sentinel names the replica as the primary
// and the replica has taken the role.
func (r *RedisSet) AwaitFailover() {
	r.t.Helper()
	// 60 s: one failover attempt may abort (a replica's facts too old after
	// a TILT on a loaded machine); the Sentinel tries again after twice its
	// failover-timeout (10 s).
	waitFor(r.t, 60*time.Second, "the Sentinel to fail over to the replica", func(ctx context.Context) error {
		s := goredis.NewSentinelClient(&goredis.Options{Addr: r.SentinelAddr()})
		defer s.Close()
		addr, err := s.GetMasterAddrByName(ctx, SentinelMaster).Result()
		if err != nil {
			return err
		}
		if len(addr) != 2 || addr[1] != strconv.Itoa(r.replicaPort) {
			return fmt.Errorf("sentinel names %v as the primary", addr)
		}
		info, err := infoOf(ctx, r.ReplicaAddr())
		if err != nil {
			return err
		}
		if !strings.Contains(info, "role:master") {
			return fmt.Errorf("the replica is not a primary yet")
		}
		return nil
	}, r.replica, r.sentinel)
}

// Failover asks the Sentinel for a graceful failover and waits until it is
// done, as AwaitFailover. In a SENTINEL FAILOVER the replica is promoted
// and the primary reconfigured to replicate from it; nothing is killed.
func (r *RedisSet) Failover() {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := goredis.NewSentinelClient(&goredis.Options{Addr: r.SentinelAddr()})
	defer s.Close()
	if err := s.Failover(ctx, SentinelMaster).Err(); err != nil {
		r.t.Fatalf("SENTINEL FAILOVER %s: %v", SentinelMaster, err)
	}
	r.AwaitFailover()
}

// Flip asks the Sentinel for a graceful failover from whichever server is
// the primary now to the other, and waits until the other is the primary,
// the Sentinel names it, and the old primary replicates from it, in sync
// and known to the Sentinel as a good replica: the next Flip can then go
// back. It returns the new primary's address. Unlike Failover it can be
// called again and again (the first one promotes the replica).
func (r *RedisSet) Flip() string {
	r.t.Helper()
	s := goredis.NewSentinelClient(&goredis.Options{Addr: r.SentinelAddr()})
	defer s.Close()
	var addr []string
	// A loaded machine can stall the Sentinel for seconds (it then enters
	// TILT mode): ask again rather than fail.
	waitFor(r.t, 60*time.Second, "the Sentinel to name the primary", func(ctx context.Context) error {
		var err error
		if addr, err = s.GetMasterAddrByName(ctx, SentinelMaster).Result(); err == nil && len(addr) != 2 {
			err = fmt.Errorf("sentinel names %v as the primary", addr)
		}
		return err
	}, r.primary, r.replica, r.sentinel)
	from, to := r.PrimaryAddr(), r.ReplicaAddr()
	if addr[1] == strconv.Itoa(r.replicaPort) {
		from, to = to, from
	}
	// The Sentinel refuses while its last failover is still being wrapped
	// up, or while it does not yet count the replica as good.
	waitFor(r.t, 60*time.Second, "the Sentinel to accept SENTINEL FAILOVER", func(ctx context.Context) error {
		return s.Failover(ctx, SentinelMaster).Err()
	}, r.primary, r.replica, r.sentinel)
	waitFor(r.t, 90*time.Second, "the failover from "+from+" to "+to, func(ctx context.Context) error {
		addr, err := s.GetMasterAddrByName(ctx, SentinelMaster).Result()
		if err != nil {
			return err
		}
		if len(addr) != 2 || "127.0.0.1:"+addr[1] != to {
			return fmt.Errorf("sentinel names %v as the primary", addr)
		}
		info, err := infoOf(ctx, to)
		if err != nil {
			return err
		}
		if !strings.Contains(info, "role:master") {
			return fmt.Errorf("%s is not a primary yet", to)
		}
		old, err := infoOf(ctx, from)
		if err != nil {
			return err
		}
		if !strings.Contains(old, "role:slave") || !strings.Contains(old, "master_link_status:up") ||
			!strings.Contains(old, "master_port:"+strings.TrimPrefix(to, "127.0.0.1:")) {
			return fmt.Errorf("%s does not replicate from %s yet", from, to)
		}
		reps, err := s.Replicas(ctx, SentinelMaster).Result()
		if err != nil {
			return err
		}
		for _, rep := range reps {
			if "127.0.0.1:"+rep["port"] == from && !strings.Contains(rep["flags"], "down") &&
				!strings.Contains(rep["flags"], "disconnected") && rep["master-link-status"] == "ok" {
				return nil
			}
		}
		return fmt.Errorf("the Sentinel does not count %s as a good replica yet: %v", from, reps)
	}, r.primary, r.replica, r.sentinel)
	return to
}
