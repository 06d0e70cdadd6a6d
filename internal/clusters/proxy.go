package clusters

import (
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from a loopback port to an upstream
// address. A replica or standby connects to its primary through one, so
// that a test can hold back the replication stream ([Proxy.Stall]) and then
// lose what was held ([Proxy.Cut]), as a lagging or partitioned replica
// would when its primary dies.
type Proxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	stalled bool
	cut     bool
	resume  chan struct{} // closed when a stall ends
	conns   []net.Conn
	wg      sync.WaitGroup
}

// NewProxy listens on a free loopback port (chosen by the kernel) and
// forwards every connection to upstream. It is closed in t.Cleanup.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, upstream: upstream, resume: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's loopback address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's loopback port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Stall stops forwarding, in both directions: what the two ends send from
// now on is held (in the proxy and in the kernel's buffers) and delivered
// only if [Proxy.Resume] is called before [Proxy.Cut].
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = true
}

// Resume forwards again, held data first.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled {
		p.stalled = false
		close(p.resume)
		p.resume = make(chan struct{})
	}
}

// Cut closes every connection, dropping what was held, and refuses new
// ones: the network between the two ends is gone.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = nil
	if p.stalled {
		p.stalled = false
		close(p.resume)
		p.resume = make(chan struct{})
	}
	p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// Close cuts the proxy and stops listening.
func (p *Proxy) Close() {
	p.Cut()
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = down.Close()
			continue
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = down.Close()
			_ = up.Close()
			continue
		}
		p.conns = append(p.conns, down, up)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, down)
		go p.pipe(down, up)
	}
}

// pipe copies src to dst, holding each chunk while the proxy is stalled.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.gate() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: close the other side too
		}
	}
}

// gate blocks while the proxy is stalled; it reports false once it is cut.
func (p *Proxy) gate() bool {
	for {
		p.mu.Lock()
		stalled, cut, resume := p.stalled, p.cut, p.resume
		p.mu.Unlock()
		if cut {
			return false
		}
		if !stalled {
			return true
		}
		<-resume
	}
}
