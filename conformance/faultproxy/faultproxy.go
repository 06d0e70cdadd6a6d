// Package faultproxy is a loopback TCP proxy that injects network faults
// between a client (a store's connection pool) and its server, one protocol
// step at a time. It knows no protocol. A step is what the client sends in
// one turn of the conversation: the bytes it writes from the moment it
// starts writing until the server answers. For request/response
// protocols (PostgreSQL, MySQL, Redis) a step is one round trip: a query, a
// pipeline, a BEGIN sent together with an INSERT, a COMMIT.
//
// A [Fault] picks a step and an [Action]. The step is the k-th step of the
// n-th connection, the k-th step across all connections, or the first step
// a predicate accepts. The action is one of:
//
//   - cut the connection before the step reaches the server;
//   - let the step through and cut the connection before the reply;
//   - let it through and drop the reply (the connection then hangs until
//     the client gives up);
//   - partition the network: nothing passes either way, and neither end
//     learns that the other closed, until the partition heals;
//   - delay the step.
//
// For example:
//
//	p, err := faultproxy.New("127.0.0.1:5432", nil)
//	if err != nil { ... }
//	defer p.Close()
//	// point the store's pool at p.Addr(), then:
//	p.Arm(faultproxy.Fault{Step: 3, Action: faultproxy.CutAfter})
//	_, err = guard.Do(ctx, key, fp, fn) // the third round trip's reply is lost
//
// [Proxy.Partition] partitions the network at once, for a stream that the
// server sends without a client's step, such as a replication stream.
//
// Steps are numbered from 1. Connections are numbered from 1 in the order
// the proxy accepted them since it started; [Proxy.Arm] restarts the count
// of steps across connections ([Step].Seq), not the per-connection counts.
// One fault is armed at a time and fires once.
//
// The proxy uses only the standard library. Every method is safe for
// concurrent use.
package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Action is what a [Fault] does to the step it fires at.
type Action int

// The actions. Each one fires at the first bytes of the chosen step.
const (
	// CutBefore closes both ends of the connection without forwarding the
	// step: the server never sees it and learns that the client is gone.
	CutBefore Action = iota + 1
	// CutAfter forwards the step, then closes both ends as soon as the
	// server starts answering, without forwarding the answer: the server
	// executed the step, the client cannot know it.
	CutAfter
	// DropReply forwards the step and then discards everything on the
	// connection, both ways. The client waits for an answer that never
	// comes, until it gives up and closes the connection. The server then
	// learns about the close.
	DropReply
	// Partition forwards the step and then isolates every connection of
	// the proxy, existing and new. Nothing passes either way, and a close
	// by either end is not passed on, as when a network partition leaves
	// both ends with half-open connections. The partition heals after
	// [Fault].Hold (or at [Proxy.Heal] or [Proxy.Close]): every connection
	// that lived through it is then closed at both ends.
	Partition
	// Delay holds the step for [Fault].Delay, then forwards it.
	Delay
)

// String returns the action's name.
func (a Action) String() string {
	switch a {
	case CutBefore:
		return "CutBefore"
	case CutAfter:
		return "CutAfter"
	case DropReply:
		return "DropReply"
	case Partition:
		return "Partition"
	case Delay:
		return "Delay"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Fault is one fault to inject: where (Conn and Step, or Match) and what
// (Action).
type Fault struct {
	// Action is what happens at the chosen step.
	Action Action
	// Conn and Step choose the step: the Step-th step of the Conn-th
	// connection. With Conn == 0, the Step-th step counted across all
	// connections since [Proxy.Arm]. Ignored when Match is set.
	Conn, Step int
	// Match, if not nil, chooses the step instead: the fault fires at the
	// first step since [Proxy.Arm] for which it returns true. It is called
	// on the proxy's goroutine of that connection, after [Config].OnStep.
	Match func(Step) bool
	// Delay is how long [Delay] holds the step.
	Delay time.Duration
	// Hold is how long a [Partition] lasts; 0 means until [Proxy.Heal] or
	// [Proxy.Close].
	Hold time.Duration
}

// Step describes one step: the first bytes a client sent in one turn.
type Step struct {
	// Conn is the connection's number (1 for the first accepted).
	Conn int
	// N is the step's number on its connection.
	N int
	// Seq is the step's number across all connections since [Proxy.Arm].
	Seq int
	// Head holds up to [Config].HeadLen of the step's first bytes, for
	// traces.
	Head []byte
	// At is when the proxy received the step's first bytes.
	At time.Time
}

// Config tunes a [Proxy]; the zero value (or nil) means the defaults.
type Config struct {
	// OnStep, if not nil, is called for every step, on the proxy's
	// goroutine of that connection, before the step is forwarded (the
	// client is waiting for its answer meanwhile). It must not block.
	OnStep func(Step)
	// HeadLen is how many bytes of each step [Step].Head keeps. Defaults
	// to 64.
	HeadLen int
	// DialTimeout bounds the connection to the upstream server. Defaults
	// to 5s.
	DialTimeout time.Duration
}

// ErrClosed is returned by [Proxy.Arm] after [Proxy.Close].
var ErrClosed = errors.New("faultproxy: proxy closed")

// Proxy forwards TCP connections from a loopback port to an upstream
// address and injects the armed [Fault]. Build it with [New].
type Proxy struct {
	ln       net.Listener
	upstream string
	opts     Config
	done     chan struct{} // closed by Close

	mu        sync.Mutex
	closed    bool
	nconns    int
	conns     map[*conn]struct{}
	seq       int
	steps     []Step
	fault     *Fault
	fired     chan struct{}
	firedStep Step
	hasFired  bool
	part      *partition
	wg        sync.WaitGroup
}

// partition is the set of connections cut off by a Partition.
type partition struct {
	conns map[*conn]struct{}
	timer *time.Timer
}

// conn is one proxied connection.
type conn struct {
	id     int
	client net.Conn
	server net.Conn // nil for a connection accepted during a partition

	// Guarded by Proxy.mu.
	steps   int
	replied bool // the server sent bytes since the current step began
	mode    mode
	closed  bool
	// passStep: the fault fired at the current step lets the rest of it
	// through (DropReply, Partition).
	passStep bool
}

type mode int

const (
	forwarding mode = iota
	cutOnReply      // CutAfter fired: cut at the first byte of the answer
	stalled         // DropReply fired: discard both ways
)

// New listens on a free loopback port and forwards every connection to
// upstream. Close it when done.
func New(upstream string, cfg *Config) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, upstream: upstream, done: make(chan struct{}), conns: make(map[*conn]struct{}), fired: make(chan struct{})}
	if cfg != nil {
		p.opts = *cfg
	}
	if p.opts.HeadLen <= 0 {
		p.opts.HeadLen = 64
	}
	if p.opts.DialTimeout <= 0 {
		p.opts.DialTimeout = 5 * time.Second
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address (127.0.0.1:port): dial it instead of the
// upstream server.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Arm replaces the armed fault (if any) with f. It restarts the count of
// steps across connections and the trace that [Proxy.Steps] returns. It
// returns a channel that is closed when f fires.
func (p *Proxy) Arm(f Fault) (<-chan struct{}, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	p.fault = &f
	p.seq = 0
	p.steps = nil
	p.fired = make(chan struct{})
	p.hasFired = false
	return p.fired, nil
}

// Disarm removes the armed fault, if it has not fired.
func (p *Proxy) Disarm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fault = nil
}

// Fired reports the step the armed fault fired at, and whether it has.
func (p *Proxy) Fired() (Step, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.firedStep, p.hasFired
}

// Steps returns the steps seen since the last [Proxy.Arm] (since New if
// never armed), in order.
func (p *Proxy) Steps() []Step {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Step(nil), p.steps...)
}

// Conns returns how many connections the proxy has accepted.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nconns
}

// Partition isolates every connection of the proxy now, existing and new,
// as a [Partition] fault does when it fires, but without waiting for a step
// of the client. Use it for a stream the server sends unasked, such as
// replication. The partition heals after hold (0: at [Proxy.Heal] or
// [Proxy.Close]). A partition already in place is kept as it is.
func (p *Proxy) Partition(hold time.Duration) { p.partition(hold) }

// Heal ends a partition now: every connection that lived through it is
// closed at both ends, and new connections are forwarded again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	part := p.part
	p.mu.Unlock()
	if part != nil {
		p.heal(part)
	}
}

// heal ends part, if it is still the current partition.
func (p *Proxy) heal(part *partition) {
	p.mu.Lock()
	if p.part != part {
		p.mu.Unlock()
		return
	}
	p.part = nil
	if part.timer != nil {
		part.timer.Stop()
	}
	cs := make([]*conn, 0, len(part.conns))
	for c := range part.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		p.cut(c)
	}
}

// CutAll closes every connection at both ends, as a restart of the network
// would; new connections are accepted as before.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	var cs []*conn
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		p.cut(c)
	}
}

// Close stops listening, heals a partition, closes every connection and
// waits for the proxy's goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.fault = nil
	close(p.done)
	p.mu.Unlock()
	err := p.ln.Close()
	p.Heal()
	p.CutAll()
	p.wg.Wait()
	return err
}
