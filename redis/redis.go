package redis

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
	"github.com/go-idempotency/idempotency/internal/ascii"
	"github.com/go-idempotency/idempotency/internal/redact"
)

// Defaults and limits of [Config].
const (
	// DefaultPrefix is the key prefix when Config.Prefix is empty.
	DefaultPrefix = "idempotency:"
	// DefaultLease is the lease of a reservation when Config.Lease is zero.
	DefaultLease = 30 * time.Second
	// MinLease is the shortest lease accepted.
	MinLease = 10 * time.Millisecond
	// MaxPrefixLen is the longest prefix accepted, in bytes.
	MaxPrefixLen = 200
)

// Config tunes a [Store]. The zero value (or nil) means the defaults.
type Config struct {
	// Prefix starts every key of the store: 1 to 200 bytes of printable
	// ASCII. A hash tag in it ("{...}", not empty) puts every key of the
	// store in one Cluster slot. Defaults to [DefaultPrefix].
	Prefix string
	// Lease is how long a reservation holds its key without being renewed.
	// While fn runs the lease is renewed every Lease/3. If the holder dies,
	// the key is free Lease after its last renewal. A retry can then run the
	// effect again (see the package doc). At least [MinLease]. Defaults
	// to [DefaultLease].
	Lease time.Duration
	// WaitReplicas, when > 0, makes a completion wait until that many
	// replicas acknowledged it. The wait is Redis WAIT, on the connection
	// that ran its EXEC. Fewer within ReplicaTimeout make Do fail with
	// [ErrNotReplicated] instead of answering. A replay waits the same
	// way: a completed record is answered only once that many replicas
	// have it (one more round trip; see the package doc), else Do fails
	// with ErrNotReplicated. Defaults to 0: answer once the primary
	// applied it (a failover can then lose an acknowledged completion, or
	// a replay of it).
	WaitReplicas int
	// ReplicaTimeout bounds that wait: at least 1ms. Defaults to
	// [DefaultReplicaTimeout].
	ReplicaTimeout time.Duration
	// Clock is for tests only. When set, the store reads it instead of
	// Redis's clock wherever it judges or stores a record's time (its
	// expiry, its creation). It sends the reading to its scripts. Nil is the
	// default, and the only setting for a service with several instances.
	// It uses Redis's own clock (TIME inside the scripts), which every
	// instance shares. No time of the application is ever sent. Leases and
	// the records' own Redis expiry (PX, PEXPIRE: durations the server
	// counts) are Redis's in either case. A test clock must never differ
	// between instances; a reading outside [backend.MinClock] ..
	// [backend.MaxExpiry] is refused with
	// [idempotency.ErrInvalidConfig] before anything is written.
	Clock func() time.Time
}

// Store is an [idempotency.KeyStore] on Redis. It is safe for concurrent use.
// Build it with [New].
type Store struct {
	client     goredis.UniversalClient
	single     *goredis.Client        // client, if it is a single node or Sentinel client (see tryWatched)
	cluster    *goredis.ClusterClient // client, if it is a Cluster client (see clusterWatchOwned)
	prefix     string
	lease      time.Duration
	renewEvery time.Duration
	poll       time.Duration
	clock      func() time.Time // Config.Clock: nil for Redis's

	reserveScript *goredis.Script
	renewScript   *goredis.Script
	releaseScript *goredis.Script
	abandonScript *goredis.Script
	adminScript   *goredis.Script

	// tokens starts every owner token of this Store. A token that starts
	// with it and is not in holds belongs to a reservation that is over,
	// whatever Redis still says (see Reserve).
	tokens string
	repl   replication
	// noRenew turns the lease renewals off, so that a held key is lost
	// Lease after it was taken (the conformance fixture's Options.Lease).
	noRenew bool

	mu      sync.Mutex
	holds   map[string]*hold // by token: the reservations this Store is making or holds
	waiting atomic.Int32     // callers waiting for a key held by another
	seen    seenKeys         // keys lately found completed
	// pins counts the goroutines of pin still alive: a released
	// connection is back in the pool once its goroutine ended.
	pins atomic.Int32
}

var _ idempotency.KeyStore[*Tx] = (*Store)(nil)

// Bounds of the clean-up of a reservation, which runs even when the
// caller's context is done. Rollback and the release after a failed
// Complete are bounded by releaseTimeout. A clean-up when the caller's
// context is already done, or after a reservation script whose reply was
// lost, is bounded by abandonTimeout (the caller is already late; see
// Reserve).
const (
	releaseTimeout = 5 * time.Second
	abandonTimeout = time.Second
)

// cleanupContext is the context of a clean-up that must run even though
// ctx may be done. It is not cancelled with ctx. It is bounded by
// releaseTimeout or, when ctx is done or its deadline is nearer, by
// abandonTimeout past that deadline. Behind a partition the caller must not
// wait the longer bound past its deadline. And an i/o timeout at the
// deadline can come back a moment before ctx reports it.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	bound := releaseTimeout
	if ctx.Err() != nil {
		bound = abandonTimeout
	} else if dl, ok := ctx.Deadline(); ok {
		bound = min(bound, max(time.Until(dl), 0)+abandonTimeout)
	}
	return context.WithTimeout(context.WithoutCancel(ctx), bound)
}

// Open connects to one Redis server and pings it under ctx. url is a
// redis:// URL, a rediss:// URL (TLS) or a bare host:port (as
// [goredis.Options].Addr takes). A URL may carry the options go-redis's
// ParseURL reads from its query (pool_size, dial_timeout and the like).
// Anything else is refused with an error wrapping
// [idempotency.ErrInvalidConfig] before a connection is made. A failed ping closes the client and is
// returned. No error holds url's password. For a Cluster or a Sentinel
// set-up, build the client with go-redis itself. The caller closes the
// returned client.
func Open(ctx context.Context, url string) (goredis.UniversalClient, error) {
	opt, err := parseURL(url)
	if err != nil {
		return nil, redact.Error(err, url) // the URL parser quotes url whole
	}
	client := goredis.NewClient(opt)
	if err := client.Ping(ctx).Err(); err != nil {
		return nil, errors.Join(fmt.Errorf("redis: open %s: %w", opt.Addr, err), client.Close())
	}
	return client, nil
}

// parseURL turns the url of [Open] into the client's options.
func parseURL(url string) (*goredis.Options, error) {
	scheme, _, hasScheme := strings.Cut(url, "://")
	switch {
	case hasScheme && (scheme == "redis" || scheme == "rediss"):
		opt, err := goredis.ParseURL(url)
		if err != nil {
			return nil, fmt.Errorf("%w: redis URL: %w", idempotency.ErrInvalidConfig, err)
		}
		return opt, nil
	case hasScheme:
		return nil, fmt.Errorf("%w: redis URL: scheme %q, want redis:// or rediss://", idempotency.ErrInvalidConfig, scheme)
	}
	host, port, err := net.SplitHostPort(url)
	if err == nil && host != "" {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil || host == "" {
		return nil, fmt.Errorf("%w: redis address %q: want redis://host:port, rediss://host:port or host:port", idempotency.ErrInvalidConfig, url)
	}
	return &goredis.Options{Addr: url}, nil
}

// New returns a Store on client. A nil cfg means the defaults; a bad field
// gives an error wrapping [idempotency.ErrInvalidConfig]. It does no I/O.
func New(client goredis.UniversalClient, cfg *Config) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil redis client", idempotency.ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if err := validatePrefix(c.Prefix); err != nil {
		return nil, err
	}
	switch {
	case c.Lease == 0:
		c.Lease = DefaultLease
	case c.Lease < MinLease:
		return nil, fmt.Errorf("%w: redis lease %v shorter than %v", idempotency.ErrInvalidConfig, c.Lease, MinLease)
	}
	repl, err := newReplication(c)
	if err != nil {
		return nil, err
	}
	single, _ := client.(*goredis.Client)
	cluster, _ := client.(*goredis.ClusterClient)
	return &Store{
		single:        single,
		cluster:       cluster,
		repl:          repl,
		client:        client,
		prefix:        c.Prefix,
		lease:         c.Lease,
		renewEvery:    c.Lease / 3,
		poll:          min(max(c.Lease/10, 50*time.Millisecond), time.Second),
		clock:         c.Clock,
		reserveScript: goredis.NewScript(reserveLua),
		renewScript:   goredis.NewScript(renewLua),
		releaseScript: goredis.NewScript(releaseLua),
		abandonScript: goredis.NewScript(abandonLua),
		adminScript:   goredis.NewScript(adminLua),
		tokens:        rand.Text() + ".",
		holds:         make(map[string]*hold),
	}, nil
}

// validatePrefix refuses prefixes that are too long, not printable ASCII,
// or whose first '{' opens an empty or unclosed hash tag: Redis would then
// hash whole key names, or a tag spilling into the record's own, and the
// keys of one record could land in different Cluster slots.
func validatePrefix(p string) error {
	if len(p) > MaxPrefixLen {
		return fmt.Errorf("%w: redis prefix is %d bytes, longer than %d", idempotency.ErrInvalidConfig, len(p), MaxPrefixLen)
	}
	if i := ascii.IndexNotPrintable(p); i >= 0 {
		return fmt.Errorf("%w: redis prefix byte %d is %#02x, not printable ASCII", idempotency.ErrInvalidConfig, i, p[i])
	}
	if open := strings.IndexByte(p, '{'); open >= 0 {
		end := strings.IndexByte(p[open+1:], '}')
		if end <= 0 {
			return fmt.Errorf("%w: redis prefix %q opens an empty or unclosed hash tag", idempotency.ErrInvalidConfig, p)
		}
	}
	return nil
}

// keys names the Redis keys of one record; all share one hash tag.
type keys struct {
	id   uint64 // a hash of the key, never 0
	base string // prefix + "{tag}:"
	rec  string // the record hash: base + "rec"
}

// wake is the pub/sub channel that waiters of the record listen on.
func (k keys) wake() string { return k.base + "wake" }

// keysFor names key's Redis keys: its tag is the first 16 bytes of the
// SHA-256 of scope, a zero byte and id, in hex. It allocates the record's
// name once, base being its prefix (a replay's look-up builds nothing else).
func (s *Store) keysFor(k idempotency.Key) keys {
	var buf [256]byte // most keys: hashed without an allocation
	b := append(append(append(buf[:0], k.Scope...), 0), k.ID...)
	sum := sha256.Sum256(b)
	var tag [32]byte
	hex.Encode(tag[:], sum[:16])
	rec := s.prefix + "{" + string(tag[:]) + "}:rec"
	return keys{id: binary.BigEndian.Uint64(sum[:]) | 1, base: rec[:len(rec)-len("rec")], rec: rec}
}

// Purge implements [idempotency.KeyStore]. Completed records carry a Redis
// expiry and vanish by themselves, so Purge deletes nothing and returns 0.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	return 0, ctx.Err()
}

// testNow is the clock argument of the store's scripts: "" for Redis's
// own clock, or the reading of the test clock ([Config.Clock]) in Unix
// milliseconds, rounded down.
func (s *Store) testNow() (string, error) {
	now, set, err := s.testClock()
	if err != nil || !set {
		return "", err
	}
	return strconv.FormatInt(now, 10), nil
}

// testClock is the reading of the test clock ([Config.Clock]) in Unix
// milliseconds, rounded down; set is false when there is none.
func (s *Store) testClock() (now int64, set bool, err error) {
	if s.clock == nil {
		return 0, false, nil
	}
	t := s.clock()
	if err := backend.CheckClock(t); err != nil {
		return 0, false, fmt.Errorf("redis: Config.Clock: %w", err)
	}
	return t.UnixMilli(), true, nil
}

// liveInMemory reports whether rec is still live. rec is a record that a
// holder of this Store completed and hands its waiters in memory. It is
// judged by the test clock, or else by the monotonic deadline until, taken
// when Redis judged or wrote it.
func (s *Store) liveInMemory(rec *backend.Record, until time.Time) bool {
	if s.clock != nil {
		return rec.ExpiresAt.UnixMilli() > s.clock().UnixMilli()
	}
	return time.Now().Before(until)
}
