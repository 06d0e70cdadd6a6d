package faultproxy_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/conformance/faultproxy"
)

func TestForwardsAndCountsSteps(t *testing.T) {
	s := startLineServer(t)
	var mu sync.Mutex
	var seen []faultproxy.Step
	p := newProxy(t, s.ln.Addr().String(), &faultproxy.Config{HeadLen: 4, OnStep: func(st faultproxy.Step) {
		mu.Lock()
		seen = append(seen, st)
		mu.Unlock()
	}})
	c := dial(t, p.Addr())
	for _, l := range []string{"alpha", "beta", "gamma"} {
		mustAsk(t, c, l)
	}
	c2 := dial(t, p.Addr())
	mustAsk(t, c2, "delta")
	steps := p.Steps()
	want := []faultproxy.Step{{Conn: 1, N: 1, Seq: 1, Head: []byte("alph")}, {Conn: 1, N: 2, Seq: 2, Head: []byte("beta")},
		{Conn: 1, N: 3, Seq: 3, Head: []byte("gamm")}, {Conn: 2, N: 1, Seq: 4, Head: []byte("delt")}}
	if len(steps) != len(want) {
		t.Fatalf("steps: got %d (%v), want %d", len(steps), steps, len(want))
	}
	for i, w := range want {
		g := steps[i]
		if g.Conn != w.Conn || g.N != w.N || g.Seq != w.Seq || !bytes.Equal(g.Head, w.Head) || g.At.IsZero() {
			t.Errorf("step %d: got %+v, want %+v", i, g, w)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != len(want) {
		t.Errorf("OnStep saw %d steps, want %d", len(seen), len(want))
	}
	if p.Conns() != 2 {
		t.Errorf("Conns: %d, want 2", p.Conns())
	}
}

func TestPipelinedWritesAreOneStep(t *testing.T) {
	s := startLineServer(t)
	p := newProxy(t, s.ln.Addr().String(), nil)
	c := dial(t, p.Addr())
	// Two requests in one write before any answer: one turn.
	if _, err := io.WriteString(c.c, "one\ntwo\n"); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"ok:one", "ok:two"} {
		got, err := c.r.ReadString('\n')
		if err != nil || strings.TrimSpace(got) != w {
			t.Fatalf("got %q, %v; want %q", got, err, w)
		}
	}
	mustAsk(t, c, "three")
	if n := len(p.Steps()); n != 2 {
		t.Fatalf("steps: %d (%v), want 2", n, p.Steps())
	}
}

func TestCutBefore(t *testing.T) {
	s := startLineServer(t)
	p := newProxy(t, s.ln.Addr().String(), nil)
	fired, err := p.Arm(faultproxy.Fault{Step: 2, Action: faultproxy.CutBefore})
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	mustAsk(t, c, "first")
	if got, err := c.ask("second", 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("second step: %q, %v; want the connection closed", got, err)
	}
	<-fired
	s.awaitClosed(t, "first", 5*time.Second)
	if got := s.received(); len(got) != 1 {
		t.Fatalf("server received %q, want only the first step", got)
	}
	if st, ok := p.Fired(); !ok || st.Seq != 2 || st.N != 2 || st.Conn != 1 {
		t.Fatalf("Fired: %+v, %v", st, ok)
	}
	// Fired once: a new connection works.
	mustAsk(t, dial(t, p.Addr()), "again")
}

func TestCutAfter(t *testing.T) {
	s := startLineServer(t)
	p := newProxy(t, s.ln.Addr().String(), nil)
	if _, err := p.Arm(faultproxy.Fault{Conn: 1, Step: 2, Action: faultproxy.CutAfter}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	mustAsk(t, c, "first")
	if got, err := c.ask("slow-second", 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("second step: %q, %v; want the connection closed without an answer", got, err)
	}
	s.awaitClosed(t, "first", 5*time.Second)
	if got := s.received(); len(got) != 2 || got[1] != "slow-second" {
		t.Fatalf("server received %q, want both steps", got)
	}
}

func TestDropReply(t *testing.T) {
	s := startLineServer(t)
	p := newProxy(t, s.ln.Addr().String(), nil)
	if _, err := p.Arm(faultproxy.Fault{Step: 1, Action: faultproxy.DropReply}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	if got, err := c.ask("first", 300*time.Millisecond); !isTimeout(err) {
		t.Fatalf("dropped reply: %q, %v; want a timeout", got, err)
	}
	if got := s.received(); len(got) != 1 {
		t.Fatalf("server received %q, want the step", got)
	}
	// The client gives up: the server learns of it.
	_ = c.c.Close()
	s.awaitClosed(t, "first", 5*time.Second)
}

func TestPartition(t *testing.T) {
	s := startLineServer(t)
	p := newProxy(t, s.ln.Addr().String(), nil)
	other := dial(t, p.Addr())
	mustAsk(t, other, "bystander")
	if _, err := p.Arm(faultproxy.Fault{Step: 1, Action: faultproxy.Partition, Hold: 700 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	start := time.Now()
	if got, err := c.ask("first", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("partitioned step: %q, %v; want a timeout", got, err)
	}
	if got, err := other.ask("more", 100*time.Millisecond); !isTimeout(err) {
		t.Fatalf("an existing connection during the partition: %q, %v; want a timeout", got, err)
	}
	if got, err := dial(t, p.Addr()).ask("new", 100*time.Millisecond); !isTimeout(err) {
		t.Fatalf("a new connection during the partition: %q, %v; want a timeout", got, err)
	}
	// The client gives up; the server does not learn until the heal.
	_ = c.c.Close()
	s.notClosed(t, "first", 700*time.Millisecond-time.Since(start)-100*time.Millisecond)
	s.awaitClosed(t, "first", 5*time.Second)
	s.awaitClosed(t, "bystander", 5*time.Second)
	if got := s.received(); len(got) != 2 || got[1] != "first" {
		t.Fatalf("server received %q, want the partitioned step and nothing after it", got)
	}
	mustAsk(t, dial(t, p.Addr()), "healed")
}

func TestHeal(t *testing.T) {
	s := startLineServer(t)
	p := newProxy(t, s.ln.Addr().String(), nil)
	if _, err := p.Arm(faultproxy.Fault{Step: 1, Action: faultproxy.Partition}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	if _, err := c.ask("first", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("want a timeout, got %v", err)
	}
	p.Heal()
	s.awaitClosed(t, "first", 5*time.Second)
	mustAsk(t, dial(t, p.Addr()), "healed")
}

// TestPartitionNow: Proxy.Partition isolates the connections at once, with
// no step to fire at: an answer the server sends afterwards is lost, and so
// is what the client sends; Close then closes them, and refuses new ones.
func TestPartitionNow(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	got, release := make(chan string, 4), make(chan struct{})
	go func() { // a server that answers its first line only once released
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		for n := 1; ; n++ {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			got <- line
			if n == 1 {
				<-release
			}
			if _, err := io.WriteString(c, "ok:"+line); err != nil {
				return
			}
		}
	}()
	p, err := faultproxy.New(ln.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	if _, err := io.WriteString(c.c, "first\n"); err != nil {
		t.Fatal(err)
	}
	<-got // the server has the line and holds its answer
	p.Partition(0)
	close(release)
	_ = c.c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if line, err := c.r.ReadString('\n'); !isTimeout(err) {
		t.Fatalf("an answer sent during the partition: %q, %v; want a timeout", line, err)
	}
	if line, err := c.ask("second", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("a step during the partition: %q, %v; want a timeout", line, err)
	}
	if line, err := dial(t, p.Addr()).ask("new", 100*time.Millisecond); !isTimeout(err) {
		t.Fatalf("a new connection during the partition: %q, %v; want a timeout", line, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if line, err := c.ask("after close", 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("after Close: %q, %v; want the connection closed and what was sent lost", line, err)
	}
	if len(got) != 0 {
		t.Fatalf("the server received %q during the partition", <-got)
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		_ = c.Close()
		t.Fatal("Close still accepts connections")
	}
}

// TestPartitionNowHeals: a Proxy.Partition with a hold heals by itself,
// closing the connections it isolated; new connections are forwarded.
func TestPartitionNowHeals(t *testing.T) {
	s := startLineServer(t)
	p := newProxy(t, s.ln.Addr().String(), nil)
	c := dial(t, p.Addr())
	mustAsk(t, c, "first")
	p.Partition(300 * time.Millisecond)
	if line, err := c.ask("lost", 100*time.Millisecond); !isTimeout(err) {
		t.Fatalf("a step during the partition: %q, %v; want a timeout", line, err)
	}
	s.awaitClosed(t, "first", 5*time.Second)
	mustAsk(t, dial(t, p.Addr()), "healed")
	if got := s.received(); len(got) != 2 || got[1] != "healed" {
		t.Fatalf("server received %q, want nothing sent during the partition", got)
	}
}

func TestDelay(t *testing.T) {
	s := startLineServer(t)
	p := newProxy(t, s.ln.Addr().String(), nil)
	const d = 150 * time.Millisecond
	if _, err := p.Arm(faultproxy.Fault{Step: 2, Action: faultproxy.Delay, Delay: d}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, p.Addr())
	mustAsk(t, c, "first")
	start := time.Now()
	mustAsk(t, c, "second")
	if el := time.Since(start); el < d {
		t.Fatalf("delayed step answered after %v, want at least %v", el, d)
	}
}

func TestConnAndMatch(t *testing.T) {
	s := startLineServer(t)
	p := newProxy(t, s.ln.Addr().String(), nil)
	if _, err := p.Arm(faultproxy.Fault{Conn: 2, Step: 1, Action: faultproxy.CutBefore}); err != nil {
		t.Fatal(err)
	}
	c1 := dial(t, p.Addr())
	mustAsk(t, c1, "one")
	if _, err := dial(t, p.Addr()).ask("two", 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("connection 2, step 1: %v; want the connection closed", err)
	}
	mustAsk(t, c1, "one-again")

	if _, err := p.Arm(faultproxy.Fault{Action: faultproxy.CutBefore, Match: func(st faultproxy.Step) bool {
		return bytes.HasPrefix(st.Head, []byte("target"))
	}}); err != nil {
		t.Fatal(err)
	}
	mustAsk(t, c1, "not-this")
	if _, err := c1.ask("target", 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("matched step: %v; want the connection closed", err)
	}
}

func TestDisarmAndClose(t *testing.T) {
	s := startLineServer(t)
	p, err := faultproxy.New(s.ln.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	fired, _ := p.Arm(faultproxy.Fault{Step: 1, Action: faultproxy.CutBefore})
	p.Disarm()
	c := dial(t, p.Addr())
	mustAsk(t, c, "one")
	select {
	case <-fired:
		t.Fatal("a disarmed fault fired")
	default:
	}
	if _, ok := p.Fired(); ok {
		t.Fatal("Fired reports a disarmed fault")
	}
	if _, err := p.Arm(faultproxy.Fault{Step: 1, Action: faultproxy.Partition}); err != nil {
		t.Fatal(err)
	}
	_, _ = dial(t, p.Addr()).ask("stuck", 100*time.Millisecond)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ask("after close", 5*time.Second); err == nil || isTimeout(err) {
		t.Fatalf("after Close: %v; want the connection closed", err)
	}
	if _, err := p.Arm(faultproxy.Fault{Step: 1, Action: faultproxy.CutBefore}); !errors.Is(err, faultproxy.ErrClosed) {
		t.Fatalf("Arm after Close: %v, want ErrClosed", err)
	}
	if got := faultproxy.Partition.String(); got != "Partition" {
		t.Fatalf("String: %q", got)
	}
}

// A step written in several pieces reaches the server whole, whatever
// fires at it.
func TestStepInPieces(t *testing.T) {
	for _, a := range []faultproxy.Action{faultproxy.CutAfter, faultproxy.DropReply, faultproxy.Partition, faultproxy.Delay} {
		t.Run(a.String(), func(t *testing.T) {
			s := startLineServer(t)
			p := newProxy(t, s.ln.Addr().String(), nil)
			if _, err := p.Arm(faultproxy.Fault{Step: 1, Action: a, Delay: 10 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			c := dial(t, p.Addr())
			for _, piece := range []string{"pie", "ces"} {
				if _, err := io.WriteString(c.c, piece); err != nil {
					t.Fatal(err)
				}
				time.Sleep(30 * time.Millisecond)
			}
			_, _ = c.ask("", 300*time.Millisecond)
			deadline := time.Now().Add(5 * time.Second)
			for len(s.received()) == 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if got := s.received(); len(got) != 1 || got[0] != "pieces" {
				t.Fatalf("server received %q, want the whole step", got)
			}
		})
	}
}
