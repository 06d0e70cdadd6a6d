package clusters

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// RedisCluster is a private Redis Cluster on loopback: masters, each with
// the same number of replicas, on ports chosen free at start.
type RedisCluster struct {
	// Masters are the nodes that own slots at start, in slot order.
	Masters []*RedisNode
	// Replicas are the replicas, Replicas[i] of Masters[i/replicas].
	Replicas []*RedisNode

	t   testing.TB
	dir string
}

// RedisNode is one node of a [RedisCluster].
type RedisNode struct {
	// Addr is host:port of the node's clients port.
	Addr string
	// ID is the node's Cluster ID.
	ID string

	proc *proc
}

// StartRedisCluster starts masters masters (slots spread evenly) with
// replicas replicas each, node timeout 1s, no persistence. The client and
// bus ports are free loopback ports, both chosen at run time. It waits
// until every node reports cluster_state:ok and every replica is in sync.
// The servers are killed (by PID) in t.Cleanup.
func StartRedisCluster(t testing.TB, masters, replicas int) *RedisCluster {
	t.Helper()
	bins := need(t, "the Redis Cluster test", "redis-server")
	dir := tempDir(t, "idem-rediscluster-")
	c := &RedisCluster{t: t, dir: dir}
	var all []*RedisNode
	ports := FreePorts(t, 2*masters*(1+replicas))
	for i := 0; i < masters*(1+replicas); i++ {
		port, bus := ports[2*i], ports[2*i+1]
		ps := strconv.Itoa(port)
		n := &RedisNode{Addr: "127.0.0.1:" + ps}
		n.proc = startRedisServer(t, bins[0], dir, "cluster-node-"+ps, port, "--appendonly", "no",
			"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(bus),
			"--cluster-config-file", filepath.Join(dir, "nodes-"+ps+".conf"), "--cluster-node-timeout", "1000")
		all = append(all, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, n := range all {
		waitFor(t, 10*time.Second, "cluster node "+n.Addr, pingRedis(n.Addr), n.proc)
		id, err := c.Node(n.Addr).ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatalf("CLUSTER MYID on %s: %v", n.Addr, err)
		}
		n.ID = id
	}
	c.Masters, c.Replicas = all[:masters], all[masters:]
	per := 16384 / masters
	for i, m := range c.Masters {
		lo, hi := i*per, (i+1)*per-1
		if i == masters-1 {
			hi = 16383
		}
		cl := c.Node(m.Addr)
		if err := cl.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			t.Fatalf("ADDSLOTSRANGE on %s: %v", m.Addr, err)
		}
		if err := cl.Do(ctx, "cluster", "set-config-epoch", i+1).Err(); err != nil {
			t.Fatalf("SET-CONFIG-EPOCH on %s: %v", m.Addr, err)
		}
	}
	first := c.Node(all[0].Addr)
	for _, n := range all[1:] {
		host, port, _ := net.SplitHostPort(n.Addr)
		bus := c.busPort(ctx, n)
		if err := first.Do(ctx, "cluster", "meet", host, port, bus).Err(); err != nil {
			t.Fatalf("CLUSTER MEET %s: %v", n.Addr, err)
		}
	}
	waitFor(t, 30*time.Second, "every node to know every other", func(ctx context.Context) error {
		for _, n := range all {
			out, err := c.Node(n.Addr).ClusterNodes(ctx).Result()
			if err != nil {
				return err
			}
			if got := strings.Count(strings.TrimSpace(out), "\n") + 1; got != len(all) || strings.Contains(out, "handshake") {
				return fmt.Errorf("%s knows %d nodes", n.Addr, got)
			}
		}
		return nil
	})
	for i, r := range c.Replicas {
		m := c.Masters[i/max(replicas, 1)]
		if err := c.Node(r.Addr).ClusterReplicate(ctx, m.ID).Err(); err != nil {
			t.Fatalf("CLUSTER REPLICATE on %s: %v", r.Addr, err)
		}
	}
	c.AwaitOK()
	return c
}

func (c *RedisCluster) busPort(ctx context.Context, n *RedisNode) string {
	v, err := c.Node(n.Addr).ConfigGet(ctx, "cluster-port").Result()
	if err != nil || v["cluster-port"] == "" {
		c.t.Fatalf("CONFIG GET cluster-port on %s: %v %v", n.Addr, v, err)
	}
	return v["cluster-port"]
}

// AwaitOK waits until every live node reports cluster_state:ok, agrees on
// who serves every slot, and every replica's link to its master is up.
func (c *RedisCluster) AwaitOK() {
	c.t.Helper()
	waitFor(c.t, 30*time.Second, "cluster_state:ok and replicas in sync", func(ctx context.Context) error {
		for _, n := range c.nodes() {
			if n.proc.exited() {
				continue
			}
			cl := c.Node(n.Addr)
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("%s: cluster not ok", n.Addr)
			}
			repl, err := cl.Info(ctx, "replication").Result()
			if err != nil {
				return err
			}
			if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
				return fmt.Errorf("%s: replica not in sync", n.Addr)
			}
		}
		return nil
	})
}

func (c *RedisCluster) nodes() []*RedisNode {
	return append(append([]*RedisNode{}, c.Masters...), c.Replicas...)
}

// Addrs returns the addresses of every node, masters first.
func (c *RedisCluster) Addrs() []string {
	var a []string
	for _, n := range c.nodes() {
		a = append(a, n.Addr)
	}
	return a
}

// Node returns a plain client of the node at addr, closed in t.Cleanup.
func (c *RedisCluster) Node(addr string) *goredis.Client {
	cl := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1})
	c.t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// NodeByID returns the node with the Cluster ID id, or nil.
func (c *RedisCluster) NodeByID(id string) *RedisNode {
	for _, n := range c.nodes() {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// OwnerOf returns the master that serves slot, as the first live master
// sees it.
func (c *RedisCluster) OwnerOf(ctx context.Context, slot int) (*RedisNode, error) {
	for _, m := range c.nodes() {
		if m.proc.exited() {
			continue
		}
		slots, err := c.Node(m.Addr).ClusterSlots(ctx).Result()
		if err != nil {
			return nil, err
		}
		for _, s := range slots {
			if int(s.Start) <= slot && slot <= int(s.End) && len(s.Nodes) > 0 {
				if n := c.NodeByID(s.Nodes[0].ID); n != nil {
					return n, nil
				}
				return nil, fmt.Errorf("slot %d: unknown node %s", slot, s.Nodes[0].ID)
			}
		}
		return nil, fmt.Errorf("slot %d: not served", slot)
	}
	return nil, fmt.Errorf("no live node")
}

// BeginMigration marks slot MIGRATING on from and IMPORTING on to, as
// redis-cli --cluster reshard does before it moves keys.
func (c *RedisCluster) BeginMigration(ctx context.Context, slot int, from, to *RedisNode) error {
	if err := c.Node(to.Addr).Do(ctx, "cluster", "setslot", slot, "importing", from.ID).Err(); err != nil {
		return fmt.Errorf("SETSLOT %d IMPORTING on %s: %w", slot, to.Addr, err)
	}
	if err := c.Node(from.Addr).Do(ctx, "cluster", "setslot", slot, "migrating", to.ID).Err(); err != nil {
		return fmt.Errorf("SETSLOT %d MIGRATING on %s: %w", slot, from.Addr, err)
	}
	return nil
}

// MoveKeys MIGRATEs every key of slot from from to to, in batches of
// batch keys, and returns how many it moved.
func (c *RedisCluster) MoveKeys(ctx context.Context, slot int, from, to *RedisNode, batch int) (int, error) {
	src := c.Node(from.Addr)
	host, port, _ := net.SplitHostPort(to.Addr)
	moved := 0
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, batch).Result()
		if err != nil {
			return moved, fmt.Errorf("GETKEYSINSLOT %d on %s: %w", slot, from.Addr, err)
		}
		if len(keys) == 0 {
			return moved, nil
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil && err.Error() != "NOKEY" {
			return moved, fmt.Errorf("MIGRATE slot %d to %s: %w", slot, to.Addr, err)
		}
		moved += len(keys)
	}
}

// EndMigration hands slot over to to: SETSLOT NODE on the target, the
// source, and then every other master.
func (c *RedisCluster) EndMigration(ctx context.Context, slot int, from, to *RedisNode) error {
	order := []*RedisNode{to, from}
	for _, m := range c.nodes() {
		if m != to && m != from && !m.proc.exited() {
			order = append(order, m)
		}
	}
	for _, n := range order {
		if err := c.Node(n.Addr).Do(ctx, "cluster", "setslot", slot, "node", to.ID).Err(); err != nil {
			// A replica refuses SETSLOT only if it is not a master:
			// its master's config reaches it through the bus.
			if strings.Contains(err.Error(), "replica") || strings.Contains(err.Error(), "slave") {
				continue
			}
			return fmt.Errorf("SETSLOT %d NODE on %s: %w", slot, n.Addr, err)
		}
	}
	return c.awaitOwner(ctx, slot, to)
}

// awaitOwner waits until every live node says to serves slot. Moving a
// slot again before that can let a node with a stale, higher-epoch view
// claim it back. A node that loses a slot by such an update deletes the
// keys it holds in it. (redis-cli --cluster reshard likewise checks that
// the nodes agree before it moves a slot.)
func (c *RedisCluster) awaitOwner(ctx context.Context, slot int, to *RedisNode) error {
	start := time.Now()
	nudged := start
	for {
		var stale []*RedisNode
		for _, n := range c.nodes() {
			if n.proc.exited() {
				continue
			}
			slots, err := c.Node(n.Addr).ClusterSlots(ctx).Result()
			if err != nil {
				return err
			}
			owner := ""
			for _, s := range slots {
				if int(s.Start) <= slot && slot <= int(s.End) && len(s.Nodes) > 0 {
					owner = s.Nodes[0].ID
				}
			}
			if owner != to.ID {
				stale = append(stale, n)
			}
		}
		if len(stale) == 0 {
			settled, err := c.epochsSettled(ctx)
			if err != nil {
				return err
			}
			if settled {
				return nil
			}
		}
		if time.Since(start) > 20*time.Second {
			if len(stale) == 0 {
				return fmt.Errorf("after %v, the nodes still disagree on config epochs", time.Since(start))
			}
			return fmt.Errorf("after %v, %s still do not say that %s serves slot %d", time.Since(start), stale[0].Addr, to.Addr, slot)
		}
		if time.Since(nudged) > time.Second {
			// What redis-cli --cluster fix does: tell the node again.
			nudged = time.Now()
			for _, n := range stale {
				_ = c.Node(n.Addr).Do(ctx, "cluster", "setslot", slot, "node", to.ID).Err()
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the nodes do not agree that %s serves slot %d: %w", to.Addr, slot, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// epochsSettled reports whether every live node sees the same config epoch
// for every master, and no two masters share one. A hand-over bumps the
// new owner's epoch without consensus, and two such bumps can collide.
// Until the collision is resolved (one node bumps again), a node with a
// stale view can send an UPDATE that takes the slot back from its new
// owner. The new owner then deletes its keys.
func (c *RedisCluster) epochsSettled(ctx context.Context) (bool, error) {
	var first map[string]string
	for _, n := range c.nodes() {
		if n.proc.exited() {
			continue
		}
		out, err := c.Node(n.Addr).ClusterNodes(ctx).Result()
		if err != nil {
			return false, err
		}
		view := map[string]string{}
		seen := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 8 || !strings.Contains(f[2], "master") {
				continue
			}
			if seen[f[6]] {
				return false, nil // two masters with one epoch
			}
			seen[f[6]] = true
			view[f[0]] = f[6]
		}
		if first == nil {
			first = view
			continue
		}
		if len(view) != len(first) {
			return false, nil
		}
		for id, e := range view {
			if first[id] != e {
				return false, nil
			}
		}
	}
	return true, nil
}

// MigrateSlot moves slot from from to to with its keys: [RedisCluster.BeginMigration],
// [RedisCluster.MoveKeys], [RedisCluster.EndMigration].
func (c *RedisCluster) MigrateSlot(ctx context.Context, slot int, from, to *RedisNode) error {
	if err := c.BeginMigration(ctx, slot, from, to); err != nil {
		return err
	}
	if _, err := c.MoveKeys(ctx, slot, from, to, 100); err != nil {
		return err
	}
	return c.EndMigration(ctx, slot, from, to)
}

// Failover runs CLUSTER FAILOVER (graceful: the master stops, the replica
// catches up, then takes over) on replica and waits until it is a master
// and the cluster is ok again.
func (c *RedisCluster) Failover(ctx context.Context, replica *RedisNode) error {
	cl := c.Node(replica.Addr)
	if err := cl.ClusterFailover(ctx).Err(); err != nil {
		return fmt.Errorf("CLUSTER FAILOVER on %s: %w", replica.Addr, err)
	}
	for {
		info, err := cl.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "role:master") {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not become master: %w", replica.Addr, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	c.AwaitOK()
	return nil
}
