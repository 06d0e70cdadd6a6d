package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/testenv"
	"github.com/go-idempotency/idempotency/internal/testkit"
)

// startCluster starts a three-master Redis Cluster on loopback ports in a
// temporary directory and returns its addresses; the servers are shut down
// in t.Cleanup.
func startCluster(t *testing.T) []string {
	t.Helper()
	server, err := exec.LookPath("redis-server")
	if err == nil {
		_, err = exec.LookPath("redis-cli")
	}
	if err != nil {
		if testenv.RequireAll() {
			t.Fatalf("redis-server and redis-cli are needed for the Cluster test, and %s=1: %v", testenv.RequireAllEnv, err)
		}
		t.Skipf("redis-server or redis-cli not installed: %v", err)
	}
	dir := t.TempDir()
	var ports []int
	start := 7101 + rand.N(150)*10
	for base := start; len(ports) < 3; base++ {
		if base > start+500 {
			t.Fatal("no free ports for the cluster")
		}
		if freePort(base) {
			ports = append(ports, base)
		}
	}
	var addrs []string
	for _, p := range ports {
		ps := strconv.Itoa(p)
		t.Cleanup(func() {
			_ = exec.Command("redis-cli", "-p", ps, "shutdown", "nosave").Run()
		})
		cmd := exec.Command(server, "--port", ps, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes-"+ps+".conf", "--save", "", "--appendonly", "no",
			"--daemonize", "yes", "--dir", dir, "--bind", "127.0.0.1",
			"--logfile", "redis-"+ps+".log", "--pidfile", dir+"/redis-"+ps+".pid")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("redis-server on %s: %v\n%s", ps, err, out)
		}
		addrs = append(addrs, "127.0.0.1:"+ps)
	}
	testkit.WaitUntil(t, 10*time.Second, "the cluster nodes to answer", func() bool {
		for _, a := range addrs {
			if out, err := exec.Command("redis-cli", "-u", "redis://"+a, "ping").Output(); err != nil || !strings.Contains(string(out), "PONG") {
				return false
			}
		}
		return true
	})
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	testkit.WaitUntil(t, 20*time.Second, "cluster_state:ok on every node", func() bool {
		for _, a := range addrs {
			out, err := exec.Command("redis-cli", "-u", "redis://"+a, "cluster", "info").Output()
			if err != nil || !strings.Contains(string(out), "cluster_state:ok") {
				return false
			}
		}
		return true
	})
	return addrs
}

func TestCluster(t *testing.T) {
	addrs := startCluster(t)
	newClient := func(testing.TB) func(int) goredis.UniversalClient {
		return func(poolSize int) goredis.UniversalClient {
			return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, PoolSize: poolSize})
		}
	}

	// The fixture's prefixes carry a hash tag; check that keys without one
	// still spread over the nodes, so the suite below exercises routing.
	t.Run("KeysSpreadOverNodes", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		client := newClient(t)(0).(*goredis.ClusterClient)
		defer client.Close()
		s, err := New(client, &Config{Prefix: "spread:" + testkit.Name("p-") + ":"})
		if err != nil {
			t.Fatal(err)
		}
		nodes := map[string]bool{}
		for i := range 30 {
			c, err := client.MasterForKey(ctx, s.keysFor(keyN(i)).rec)
			if err != nil {
				t.Fatal(err)
			}
			nodes[c.Options().Addr] = true
		}
		if len(nodes) < 2 {
			t.Fatalf("30 keys landed on %d node(s), want several", len(nodes))
		}
	})

	t.Run("Conformance", func(t *testing.T) {
		conformance.Run(t, harness(newClient))
	})

	// Without a hash tag in the prefix, records of different keys live on
	// different nodes; effects named by Tx.Key stay in their record's slot.
	t.Run("UntaggedPrefix", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		client := newClient(t)(0)
		prefix := "untagged:" + testkit.Name("p-") + ":"
		t.Cleanup(func() { dropPrefix(t, client, prefix); _ = client.Close() })
		s, err := New(client, &Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 12 {
			k := keyN(i)
			r := reservation(k, "fp", time.Second)
			txn, _, err := s.Reserve(ctx, r)
			if err != nil || txn == nil {
				t.Fatalf("reserve %d: %v", i, err)
			}
			incr := txn.Tx().Incr(ctx, txn.Tx().Key("n"))
			if err := txn.Complete(ctx, resp201(i)); err != nil {
				t.Fatalf("complete %d: %v", i, err)
			}
			if incr.Val() != 1 {
				t.Fatalf("key %d: INCR queued on the Tx gave %d, %v; want 1", i, incr.Val(), incr.Err())
			}
			_, rec, err := s.Reserve(ctx, r)
			if err != nil || rec == nil || rec.Status != 201 || string(rec.Body) != fmt.Sprint(i) {
				t.Fatalf("replay %d: %+v, %v", i, rec, err)
			}
		}
	})
}
