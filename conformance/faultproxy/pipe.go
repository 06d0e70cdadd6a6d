package faultproxy

import "time"

// clientToServer forwards what the client sends, step by step, applying
// the armed fault.
func (p *Proxy) clientToServer(c *conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.client.Read(buf)
		if n > 0 && !p.fromClient(c, buf[:n]) {
			return
		}
		if err != nil {
			p.closedBy(c)
			return
		}
	}
}

// serverToClient forwards what the server sends, unless a fault says
// otherwise.
func (p *Proxy) serverToClient(c *conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.server.Read(buf)
		if n > 0 {
			p.mu.Lock()
			c.replied = true
			md, iso := c.mode, p.isolated(c)
			p.mu.Unlock()
			switch {
			case iso || md == stalled: // dropped
			case md == cutOnReply:
				p.cut(c)
				return
			default:
				if _, werr := c.client.Write(buf[:n]); werr != nil {
					p.closedBy(c)
					return
				}
			}
		}
		if err != nil {
			p.closedBy(c)
			return
		}
	}
}

// closedBy handles the end of one side of c: the other side learns of it,
// unless a partition isolates c (then it learns when the partition heals).
func (p *Proxy) closedBy(c *conn) {
	p.mu.Lock()
	iso := p.isolated(c)
	p.mu.Unlock()
	if !iso {
		p.cut(c)
	}
}

// fromClient handles bytes b the client sent on c; it reports false once c
// is cut.
func (p *Proxy) fromClient(c *conn, b []byte) bool {
	p.mu.Lock()
	newStep := c.steps == 0 || c.replied
	var st Step
	if newStep {
		c.steps++
		c.replied = false
		p.seq++
		st = Step{Conn: c.id, N: c.steps, Seq: p.seq, Head: append([]byte(nil), b[:min(len(b), p.opts.HeadLen)]...), At: time.Now()}
		p.steps = append(p.steps, st)
	}
	if newStep {
		c.passStep = false
	}
	armed, md, iso, pass := p.fault, c.mode, p.isolated(c), c.passStep
	p.mu.Unlock()
	switch {
	case pass:
		// The rest of the step a DropReply or a Partition fired at: the
		// server gets all of it.
		return p.forward(c, b)
	case iso || md == stalled:
		return true // dropped
	case md == cutOnReply && newStep:
		// The client moved on without an answer: cut before this step.
		p.cut(c)
		return false
	}
	var f *Fault
	if newStep {
		if p.opts.OnStep != nil {
			p.opts.OnStep(st)
		}
		if armed != nil && matches(armed, st) {
			p.mu.Lock()
			if p.fault == armed { // not disarmed, not fired elsewhere
				p.fault = nil
				p.firedStep, p.hasFired = st, true
				close(p.fired)
				f = armed
			}
			p.mu.Unlock()
		}
	}
	if f != nil {
		switch f.Action {
		case CutBefore:
			p.cut(c)
			return false
		case Delay:
			t := time.NewTimer(f.Delay)
			select {
			case <-t.C:
			case <-p.done:
				t.Stop()
				return false
			}
		case CutAfter:
			p.setMode(c, cutOnReply)
		case DropReply:
			p.mu.Lock()
			c.mode, c.passStep = stalled, true
			p.mu.Unlock()
		case Partition:
			p.mu.Lock()
			c.passStep = true
			p.mu.Unlock()
			p.partition(f.Hold)
		}
	}
	return p.forward(c, b)
}

// forward writes b to c's server; it reports false once c is cut.
func (p *Proxy) forward(c *conn, b []byte) bool {
	if _, err := c.server.Write(b); err != nil {
		p.closedBy(c)
		return false
	}
	return true
}

func matches(f *Fault, st Step) bool {
	switch {
	case f.Match != nil:
		return f.Match(st)
	case f.Conn == 0:
		return st.Seq == f.Step
	}
	return st.Conn == f.Conn && st.N == f.Step
}

func (p *Proxy) setMode(c *conn, m mode) {
	p.mu.Lock()
	c.mode = m
	p.mu.Unlock()
}

// partition isolates every connection from now on, for hold (0: until
// Heal or Close).
func (p *Proxy) partition(hold time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.part != nil || p.closed {
		return
	}
	part := &partition{conns: make(map[*conn]struct{}, len(p.conns))}
	for c := range p.conns {
		part.conns[c] = struct{}{}
	}
	if hold > 0 {
		part.timer = time.AfterFunc(hold, func() { p.heal(part) })
	}
	p.part = part
}
