package faultproxy

import (
	"net"
)

// accept takes the proxy's connections.
func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = down.Close()
			return
		}
		p.nconns++
		c := &conn{id: p.nconns, client: down}
		p.conns[c] = struct{}{}
		if p.part != nil {
			// The network is partitioned: the connection goes nowhere
			// until the partition heals, then it is closed.
			p.part.conns[c] = struct{}{}
			p.wg.Add(1)
			p.mu.Unlock()
			go p.discard(c)
			continue
		}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.open(c)
	}
}

// open dials the upstream server for c and starts its two pipes.
func (p *Proxy) open(c *conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.upstream, p.opts.DialTimeout)
	if err != nil {
		p.cut(c)
		return
	}
	p.mu.Lock()
	if c.closed || p.closed {
		p.mu.Unlock()
		_ = up.Close()
		p.cut(c)
		return
	}
	c.server = up
	if p.part != nil {
		p.part.conns[c] = struct{}{}
	}
	p.wg.Add(2)
	p.mu.Unlock()
	go p.clientToServer(c)
	go p.serverToClient(c)
}

// discard reads and drops what a client sends on a connection accepted
// during a partition, until it is closed.
func (p *Proxy) discard(c *conn) {
	defer p.wg.Done()
	buf := make([]byte, 4096)
	for {
		if _, err := c.client.Read(buf); err != nil {
			return
		}
	}
}

// cut closes both ends of c.
func (p *Proxy) cut(c *conn) {
	p.mu.Lock()
	c.closed = true
	delete(p.conns, c)
	server := c.server
	p.mu.Unlock()
	_ = c.client.Close()
	if server != nil {
		_ = server.Close()
	}
}

// isolated reports whether c is cut off by a partition. p.mu is held.
func (p *Proxy) isolated(c *conn) bool {
	if p.part == nil {
		return false
	}
	_, ok := p.part.conns[c]
	return ok
}
