package redis

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stallProxy is a loopback TCP proxy to a Redis server that can hold back
// the next chunk of bytes in one direction: the next reply (or request)
// then reaches its peer d late, after the caller's deadline, as over a
// slow or lossy network.
type stallProxy struct {
	ln     net.Listener
	target string
	// Durations to hold the next chunk for, each taken by the first chunk
	// that finds it > 0.
	nextReply   atomic.Int64
	nextRequest atomic.Int64
	stalls      atomic.Int64 // chunks held back and then passed on

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

// startStallProxy listens on a free loopback port; the proxy is closed in
// t.Cleanup.
func startStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// Addr is the address clients dial.
func (p *stallProxy) Addr() string { return p.ln.Addr().String() }

// stallReply holds the next chunk the server sends for d.
func (p *stallProxy) stallReply(d time.Duration) { p.nextReply.Store(int64(d)) }

// stallRequest holds the next chunk a client sends for d.
func (p *stallProxy) stallRequest(d time.Duration) { p.nextRequest.Store(int64(d)) }

func (p *stallProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(s, c, &p.nextRequest) })
		p.wg.Go(func() { p.pipe(c, s, &p.nextReply) })
	}
}

// pipe copies from src to dst, holding a chunk back when stall says so,
// and closes both ends when either ends.
func (p *stallProxy) pipe(dst, src net.Conn, stall *atomic.Int64) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			d := stall.Swap(0)
			if d > 0 {
				time.Sleep(time.Duration(d))
			}
			_, werr := dst.Write(buf[:n])
			if d > 0 {
				p.stalls.Add(1)
			}
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *stallProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
