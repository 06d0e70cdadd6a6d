// Package stripeclient runs a retrying HTTP client that did not come from
// this repository, the official Stripe Node SDK, against an idemhttp
// server through a proxy that drops, delays, cuts and resets connections.
// The test (stripe_test.go) asserts that no key has a second effect in the
// database and that every error reaches the SDK as an error.
//
// The SDK is installed with npm ci in node/ (.ci/run does it); the test
// needs node on the PATH.
package stripeclient

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"
)

// Fault is what the proxy does to one request.
type Fault int

// The faults. The Drop and Reset faults before forwarding lose the request;
// after forwarding they lose the answer of a request the server processed.
const (
	None          Fault = iota
	DelayRequest        // wait, then forward
	DropRequest         // close the connection without forwarding
	ResetRequest        // reset the connection (RST) without forwarding
	DropResponse        // forward, then close the connection without answering
	ResetResponse       // forward, then reset the connection
	TruncateBody        // forward, then send the status, headers and half the body
	DelayResponse       // forward, wait, then answer
	numFaults
)

var faultNames = [...]string{"none", "delay-request", "drop-request", "reset-request", "drop-response",
	"reset-response", "truncate-body", "delay-response"}

// String returns the fault's name.
func (f Fault) String() string {
	if f < 0 || f >= numFaults {
		return "unknown"
	}
	return faultNames[f]
}

// Proxy is an HTTP/1.1 proxy (an http.Handler) in front of one upstream
// server. Each request gets a fault drawn from a seeded generator: with
// probability Rate one of the faults other than None, uniformly.
type Proxy struct {
	upstream string
	client   *http.Client
	rate     float64
	maxDelay time.Duration

	mu     sync.Mutex
	rng    *rand.Rand
	counts [numFaults]int
}

// NewProxy returns a proxy to upstream (a base URL such as
// http://127.0.0.1:8080) that injects a fault into a request with
// probability rate, with delays up to maxDelay, drawn from seed.
func NewProxy(upstream string, rate float64, maxDelay time.Duration, seed uint64) *Proxy {
	return &Proxy{
		upstream: upstream,
		client:   &http.Client{Timeout: 30 * time.Second},
		rate:     rate,
		maxDelay: maxDelay,
		rng:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
}

// Counts returns how many requests got each fault, None included.
func (p *Proxy) Counts() map[Fault]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[Fault]int{}
	for f, n := range p.counts {
		if n > 0 {
			out[Fault(f)] = n
		}
	}
	return out
}

// draw picks the next request's fault and delay.
func (p *Proxy) draw() (Fault, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := None
	if p.rng.Float64() < p.rate {
		f = Fault(1 + p.rng.IntN(int(numFaults)-1))
	}
	p.counts[f]++
	d := time.Duration(0)
	if p.maxDelay > 0 {
		d = time.Duration(p.rng.Int64N(int64(p.maxDelay)))
	}
	return f, d
}

// ServeHTTP forwards r to the upstream server, with the fault drawn for it.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f, d := p.draw()
	switch f {
	case DropRequest:
		cut(w, false)
		return
	case ResetRequest:
		cut(w, true)
		return
	case DelayRequest:
		time.Sleep(d)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		cut(w, false)
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.upstream+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	req.Header = r.Header.Clone()
	resp, err := p.client.Do(req)
	if err != nil {
		cut(w, false) // the upstream did not answer: neither does the proxy
		return
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		cut(w, false)
		return
	}
	switch f {
	case DropResponse:
		cut(w, false)
		return
	case ResetResponse:
		cut(w, true)
		return
	case DelayResponse:
		time.Sleep(d)
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	if f == TruncateBody && len(answer) > 1 {
		w.WriteHeader(resp.StatusCode) // Content-Length stays the whole body's
		_, _ = w.Write(answer[:len(answer)/2])
		http.NewResponseController(w).Flush()
		cut(w, false)
		return
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}

// cut closes the client's connection without an answer, or with a reset.
func cut(w http.ResponseWriter, reset bool) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler) // net/http closes the connection
	}
	if tc, ok := conn.(*net.TCPConn); ok && reset {
		_ = tc.SetLinger(0) // Close sends RST
	}
	_ = conn.Close()
}
