package faultproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/conformance/faultproxy"
)

// lineServer answers every line it reads with "ok:" and the line, and
// records what it received and which connections it saw closed.
type lineServer struct {
	ln     net.Listener
	mu     sync.Mutex
	lines  []string
	closed chan string // the first line of each connection that ended, or ""
	seen   map[string]bool
	wg     sync.WaitGroup
}

func startLineServer(t *testing.T) *lineServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &lineServer{ln: ln, closed: make(chan string, 64), seen: map[string]bool{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go s.serve(c)
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); s.wg.Wait() })
	return s
}

func (s *lineServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer c.Close()
	r := bufio.NewReader(c)
	first := ""
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			s.closed <- first
			return
		}
		line = strings.TrimSuffix(line, "\n")
		if first == "" {
			first = line
		}
		s.mu.Lock()
		s.lines = append(s.lines, line)
		s.mu.Unlock()
		if strings.HasPrefix(line, "slow") {
			time.Sleep(50 * time.Millisecond)
		}
		if _, err := io.WriteString(c, "ok:"+line+"\n"); err != nil {
			s.closed <- first
			return
		}
	}
}

func (s *lineServer) received() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

// awaitClosed waits until the server saw the connection whose first line
// was first end, or fails after d.
func (s *lineServer) awaitClosed(t *testing.T, first string, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for !s.seen[first] {
		select {
		case f := <-s.closed:
			s.seen[f] = true
		case <-deadline:
			t.Fatalf("the server did not see the connection of %q close within %v", first, d)
		}
	}
}

// notClosed fails if the server sees the connection of first close within d.
func (s *lineServer) notClosed(t *testing.T, first string, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case f := <-s.closed:
			s.seen[f] = true
			if f == first {
				t.Fatalf("the server saw the connection of %q close during the partition", first)
			}
		case <-deadline:
			return
		}
	}
}

func newProxy(t *testing.T, upstream string, opts *faultproxy.Config) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(upstream, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() { _ = p.Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Close did not return within 5s")
		}
	})
	return p
}

type client struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &client{c: c, r: bufio.NewReader(c)}
}

// ask sends line and returns the answer, or the error that ended the wait
// (within d).
func (c *client) ask(line string, d time.Duration) (string, error) {
	_ = c.c.SetDeadline(time.Now().Add(d))
	if _, err := io.WriteString(c.c, line+"\n"); err != nil {
		return "", err
	}
	s, err := c.r.ReadString('\n')
	return strings.TrimSuffix(s, "\n"), err
}

func mustAsk(t *testing.T, c *client, line string) {
	t.Helper()
	got, err := c.ask(line, 5*time.Second)
	if err != nil || got != "ok:"+line {
		t.Fatalf("ask %q: %q, %v; want %q", line, got, err, "ok:"+line)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded)
}
