package clusters

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	// The MariaDB driver, registered as "mysql".
	_ "github.com/go-sql-driver/mysql"
)

// GaleraNodes is the size of the cluster [StartGalera] starts.
const GaleraNodes = 3

// galeraProviders are where distributions put the Galera 4 provider.
var galeraProviders = []string{
	"/usr/lib/galera/libgalera_smm.so",
	"/usr/lib/libgalera_smm.so",
	"/usr/lib64/galera-4/libgalera_smm.so",
	"/usr/lib64/galera/libgalera_smm.so",
}

// Galera is a three-node MariaDB Galera Cluster on loopback.
type Galera struct {
	t     testing.TB
	dir   string
	acct  account
	nodes []*proc
	// sqlPorts[i] is node i's SQL port.
	sqlPorts []int
}

// StartGalera starts a three-node MariaDB Galera Cluster on loopback. Each
// node gets one option file and data directory (initialised with
// mariadb-install-db, root without a password). The first node starts with
// --wsrep-new-cluster; the other two join it one after the other (rsync
// SST). Every port (SQL, group communication, and the IST and SST
// ports that joiners use in turn) is found free on loopback at run time.
// It returns once wsrep_cluster_size is 3 and every node is
// Synced, with a database named test. The servers run as the system user
// mysql and are killed in t.Cleanup.
//
// Failure detection is shortened: a node that stops answering is evicted
// after about 1.5 s instead of 5 s. So a test that kills a node spends
// little time with writes paused.
func StartGalera(t testing.TB) *Galera {
	t.Helper()
	const what = "the Galera test"
	bins := need(t, what, "mariadbd", "mariadb-install-db", "rsync", "wsrep_sst_rsync")
	provider, err := firstExisting(galeraProviders...)
	if err != nil {
		need(t, what, "libgalera_smm.so (package galera-4): "+err.Error())
	}
	acct := lookupAccount(t, what, "mysql")
	// SQL and group communication ports per node. Then the IST and SST
	// ports that joiners use in turn, one node at a time. Then the
	// bootstrap node's IST/SST address, never opened.
	ports := FreePorts(t, 2*GaleraNodes+3)
	sqlPorts, groupPorts := ports[:GaleraNodes], ports[GaleraNodes:2*GaleraNodes]
	istPort, sstPort, sparePort := ports[2*GaleraNodes], ports[2*GaleraNodes+1], ports[2*GaleraNodes+2]
	dir := tempDir(t, "idem-clusters-galera-")
	g := &Galera{t: t, dir: dir, acct: acct, sqlPorts: sqlPorts}

	userLine := "" // not root: run as the current user
	if acct.name != "" {
		userLine = "user=" + acct.name
	}
	var group []string
	for i := range GaleraNodes {
		group = append(group, "127.0.0.1:"+strconv.Itoa(groupPorts[i]))
	}
	var wg sync.WaitGroup
	errs := make([]string, GaleraNodes)
	for i := range GaleraNodes {
		nd := g.nodeDir(i)
		mkdirOwned(t, nd, 0o755, acct)
		mkdirOwned(t, filepath.Join(nd, "data"), 0o750, acct)
		ist, sst := istPort, sstPort
		if i == 0 {
			ist, sst = sparePort, sparePort
		}
		cnf := fmt.Sprintf(`[mysqld]
datadir=%[1]s/data
socket=%[1]s/mysqld.sock
pid-file=%[1]s/mysqld.pid
log-error=%[1]s/error.log
port=%[2]d
bind-address=127.0.0.1
%[9]s
skip-name-resolve
binlog_format=ROW
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
innodb_buffer_pool_size=64M
innodb_log_file_size=16M
innodb_flush_log_at_trx_commit=2
max_connections=200
wsrep_on=ON
wsrep_provider=%[3]s
wsrep_cluster_name=idempotency_ha
wsrep_cluster_address=gcomm://%[4]s
wsrep_node_name=node%[5]d
wsrep_node_address=127.0.0.1
wsrep_provider_options="gmcast.listen_addr=tcp://127.0.0.1:%[6]d;ist.recv_addr=127.0.0.1:%[7]d;gcache.size=32M;evs.keepalive_period=PT0.2S;evs.inactive_check_period=PT0.5S;evs.suspect_timeout=PT1.5S;evs.inactive_timeout=PT3S;evs.install_timeout=PT3S"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:%[8]d
`, nd, sqlPorts[i], provider, strings.Join(group, ","), i+1, groupPorts[i], ist, sst, userLine)
		writeOwned(t, g.cnf(i), cnf, acct)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = g.installDB(bins[1], i)
		}()
	}
	wg.Wait()
	for i, e := range errs {
		if e != "" {
			// Three bootstraps at once on a busy machine fail now and
			// then: try once more, alone.
			if e2 := g.installDB(bins[1], i); e2 != "" {
				t.Fatalf("%s\nthen, alone: %s", e, e2)
			}
		}
	}
	for i := range GaleraNodes {
		args := []string{"--defaults-file=" + g.cnf(i)}
		if i == 0 {
			args = append(args, "--wsrep-new-cluster")
		}
		p := startProc(t, fmt.Sprintf("mariadbd node %d", i+1), command(account{}, bins[0], args...), filepath.Join(g.nodeDir(i), "stdout.log"))
		g.nodes = append(g.nodes, p)
		waitFor(t, 60*time.Second, fmt.Sprintf("node %d to be Synced in a cluster of %d", i+1, i+1), func(ctx context.Context) error {
			return g.synced(ctx, i, i+1)
		}, p)
		if i == 0 {
			db := g.DB(0, "")
			if _, err := db.Exec("CREATE DATABASE IF NOT EXISTS test"); err != nil {
				t.Fatalf("create database test: %v", err)
			}
			_ = db.Close()
		}
	}
	return g
}

// installDB initialises node i's data directory (emptied first), and
// returns a description of the failure, or "".
func (g *Galera) installDB(bin string, i int) string {
	data := filepath.Join(g.nodeDir(i), "data")
	entries, _ := os.ReadDir(data)
	for _, e := range entries {
		_ = os.RemoveAll(filepath.Join(data, e.Name()))
	}
	args := []string{"--defaults-file=" + g.cnf(i), "--auth-root-authentication-method=normal", "--skip-test-db"}
	if g.acct.name != "" {
		args = append(args, "--user="+g.acct.name)
	}
	cmd := command(account{}, bin, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Sprintf("mariadb-install-db node %d: %v\n%s\nerror log:\n%s", i+1, err, out, tail(filepath.Join(g.nodeDir(i), "error.log"), 3000))
	}
	return ""
}

func (g *Galera) nodeDir(i int) string { return filepath.Join(g.dir, "node"+strconv.Itoa(i+1)) }
func (g *Galera) cnf(i int) string     { return filepath.Join(g.nodeDir(i), "my.cnf") }

// DSN is a go-sql-driver/mysql DSN of database db on node i (0..2), with
// the options the mysql store recommends.
func (g *Galera) DSN(i int, db string) string {
	return "root@tcp(127.0.0.1:" + strconv.Itoa(g.sqlPorts[i]) + ")/" + db +
		"?interpolateParams=true&innodb_lock_wait_timeout=30&timeout=5s&readTimeout=40s&writeTimeout=10s"
}

// DB opens a pool on node i; the caller closes it.
func (g *Galera) DB(i int, db string) *sql.DB {
	g.t.Helper()
	d, err := sql.Open("mysql", g.DSN(i, db))
	if err != nil {
		g.t.Fatal(err)
	}
	return d
}

// Status reads a global status variable of node i.
func (g *Galera) Status(ctx context.Context, i int, name string) (string, error) {
	db, err := sql.Open("mysql", g.DSN(i, ""))
	if err != nil {
		return "", err
	}
	defer db.Close()
	var n, v string
	if err := db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE ?", name).Scan(&n, &v); err != nil {
		return "", err
	}
	return v, nil
}

// synced checks that node i is Synced in a primary component of size nodes.
func (g *Galera) synced(ctx context.Context, i, size int) error {
	state, err := g.Status(ctx, i, "wsrep_local_state_comment")
	if err != nil {
		return err
	}
	n, err := g.Status(ctx, i, "wsrep_cluster_size")
	if err != nil {
		return err
	}
	status, err := g.Status(ctx, i, "wsrep_cluster_status")
	if err != nil {
		return err
	}
	if state != "Synced" || n != strconv.Itoa(size) || status != "Primary" {
		return fmt.Errorf("node %d: %s, cluster size %s, %s", i+1, state, n, status)
	}
	return nil
}

// Kill kills node i with SIGKILL.
func (g *Galera) Kill(i int) { g.nodes[i].kill() }

// AwaitSize waits until every node in alive is Synced in a primary
// component of len(alive) nodes.
func (g *Galera) AwaitSize(alive ...int) {
	g.t.Helper()
	waitFor(g.t, 30*time.Second, fmt.Sprintf("nodes %v to form a cluster of %d", alive, len(alive)), func(ctx context.Context) error {
		for _, i := range alive {
			if err := g.synced(ctx, i, len(alive)); err != nil {
				return err
			}
		}
		return nil
	})
}

// Log returns the end of node i's error log, for failure messages.
func (g *Galera) Log(i int) string { return tail(filepath.Join(g.nodeDir(i), "error.log"), 4000) }
