package clusters

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency/conformance/faultproxy"
)

// PostgresPair is a PostgreSQL primary and a streaming standby on loopback.
// The standby replicates through a [faultproxy.Proxy].
type PostgresPair struct {
	// Sync is whether commits wait for the standby (synchronous_commit=on
	// with synchronous_standby_names set) or not (asynchronous streaming).
	Sync bool
	// Link carries the replication connection between the standby and
	// the primary: [faultproxy.Proxy.Partition] holds back what the
	// primary sends, as a lagging or partitioned standby would see it.
	Link *faultproxy.Proxy

	t           testing.TB
	bin         string
	acct        account
	dir         string
	primaryPort int
	standbyPort int
	primary     *proc
	standby     *proc
}

// StartPostgres initialises a primary (initdb, trust authentication for
// user postgres, database test). It takes a base backup of it with
// pg_basebackup -R into a standby that streams from the primary through a
// [faultproxy.Proxy]. It waits until the standby streams. Both listen on loopback ports found
// free at run time. With sync, the primary runs
// synchronous_commit=on and synchronous_standby_names='*': a commit is
// acknowledged only once the standby has flushed it. Everything runs as
// the system user postgres and is removed in t.Cleanup.
func StartPostgres(t testing.TB, sync bool) *PostgresPair {
	t.Helper()
	const what = "the PostgreSQL failover test"
	bin := postgresBin(t, what)
	acct := lookupAccount(t, what, "postgres")
	dir := tempDir(t, "idem-clusters-pg-")
	ports := FreePorts(t, 2)
	p := &PostgresPair{Sync: sync, t: t, bin: bin, acct: acct, dir: dir, primaryPort: ports[0], standbyPort: ports[1]}
	mkdirOwned(t, filepath.Join(dir, "sock"), 0o755, acct)
	primaryData := filepath.Join(dir, "primary")
	mkdirOwned(t, primaryData, 0o700, acct)
	runCmd(t, time.Minute, acct, filepath.Join(bin, "initdb"), "-D", primaryData, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--no-sync", "--locale=C")
	conf := "listen_addresses = '127.0.0.1'\n" +
		"unix_socket_directories = '" + filepath.Join(dir, "sock") + "'\n" +
		"shared_buffers = 32MB\n" +
		"max_connections = 60\n" +
		"wal_level = replica\n" +
		"max_wal_senders = 4\n" +
		"wal_keep_size = 64MB\n" +
		"logging_collector = off\n"
	// synchronous_standby_names is set once the standby streams: before,
	// every commit would wait for it.
	conf += "synchronous_commit = on\nsynchronous_standby_names = ''\n"
	appendFile(t, filepath.Join(primaryData, "postgresql.conf"), conf)
	p.primary = p.start("primary", primaryData, p.primaryPort)
	waitFor(t, 30*time.Second, "the primary to accept connections", p.ping(p.PrimaryDSN("postgres")), p.primary)
	conn := p.connect(p.primaryPort, "postgres")
	if _, err := conn.Exec(context.Background(), "CREATE DATABASE test"); err != nil {
		t.Fatalf("create database test: %v", err)
	}
	_ = conn.Close(context.Background())

	var linkPort int
	p.Link, linkPort = replicationLink(t, "127.0.0.1:"+strconv.Itoa(p.primaryPort))
	standbyData := filepath.Join(dir, "standby")
	mkdirOwned(t, standbyData, 0o700, acct)
	runCmd(t, time.Minute, acct, filepath.Join(bin, "pg_basebackup"), "-h", "127.0.0.1",
		"-p", strconv.Itoa(linkPort), "-U", "postgres", "-D", standbyData, "-R",
		"-X", "stream", "--checkpoint=fast", "--no-sync")
	appendFile(t, filepath.Join(standbyData, "postgresql.auto.conf"),
		"primary_conninfo = 'host=127.0.0.1 port="+strconv.Itoa(linkPort)+" user=postgres application_name=standby1'\n")
	p.standby = p.start("standby", standbyData, p.standbyPort)
	if sync {
		conn := p.connect(p.primaryPort, "postgres")
		for _, q := range []string{"ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"} {
			if _, err := conn.Exec(context.Background(), q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		_ = conn.Close(context.Background())
	}
	waitFor(t, 30*time.Second, "the standby to stream from the primary", func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, p.PrimaryDSN("postgres"))
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		var state, syncState string
		err = conn.QueryRow(ctx, "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = 'standby1'").Scan(&state, &syncState)
		if err != nil {
			return err
		}
		want := "async"
		if sync {
			want = "sync"
		}
		if state != "streaming" || syncState != want {
			return fmt.Errorf("standby is %s, %s; want streaming, %s", state, syncState, want)
		}
		return nil
	}, p.primary, p.standby)
	return p
}

// postgresBin finds the newest /usr/lib/postgresql/*/bin holding initdb,
// pg_basebackup, postgres and pg_ctl.
func postgresBin(t testing.TB, what string) string {
	t.Helper()
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			need(t, what, filepath.Join(d, "pg_basebackup"), filepath.Join(d, "postgres"), filepath.Join(d, "pg_ctl"))
			return d
		}
	}
	need(t, what, "initdb", "pg_basebackup", "postgres", "pg_ctl")
	p, _ := findBinary("initdb")
	return filepath.Dir(p)
}

func appendFile(t testing.TB, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func (p *PostgresPair) start(name, data string, port int) *proc {
	p.t.Helper()
	cmd := command(p.acct, filepath.Join(p.bin, "postgres"), "-D", data, "-p", strconv.Itoa(port))
	return startProc(p.t, "postgres "+name, cmd, filepath.Join(p.dir, name+".log"))
}

func (p *PostgresPair) ping(dsn string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	}
}

func (p *PostgresPair) connect(port int, db string) *pgx.Conn {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn(port, db))
	if err != nil {
		p.t.Fatalf("connect to port %d: %v", port, err)
	}
	return conn
}

func dsn(port int, db string) string {
	return "postgres://postgres@127.0.0.1:" + strconv.Itoa(port) + "/" + db + "?sslmode=disable"
}

// PrimaryDSN is a pgx URL of database db on the primary.
func (p *PostgresPair) PrimaryDSN(db string) string { return dsn(p.primaryPort, db) }

// StandbyDSN is a pgx URL of database db on the standby.
func (p *PostgresPair) StandbyDSN(db string) string { return dsn(p.standbyPort, db) }

// KillPrimary kills the primary and every process it started with SIGKILL:
// no shutdown checkpoint, nothing more sent to the standby. It cuts the
// replication link, dropping whatever a partition of the link held back.
func (p *PostgresPair) KillPrimary() {
	p.primary.kill()
	_ = p.Link.Close()
}

// Promote promotes the standby (pg_ctl promote) and waits until it accepts
// writes.
func (p *PostgresPair) Promote() {
	p.t.Helper()
	runCmd(p.t, 30*time.Second, p.acct, filepath.Join(p.bin, "pg_ctl"), "promote", "-D", filepath.Join(p.dir, "standby"), "-w", "-t", "30")
	waitFor(p.t, 30*time.Second, "the promoted standby to accept writes", func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, p.StandbyDSN("test"))
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		var recovering bool
		if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering); err != nil {
			return err
		}
		if recovering {
			return errNotReady
		}
		return nil
	}, p.standby)
}
