package clusters

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// TestProxy: bytes pass, are held while stalled, flow again on Resume, and
// are lost on Cut.
func TestProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() { // an echo server, line by line
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	p := NewProxy(t, ln.Addr().String())
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	echo := func(msg string, wait time.Duration) (string, error) {
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		return r.ReadString('\n')
	}
	if got, err := echo("one", 5*time.Second); err != nil || got != "one\n" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}
	p.Stall()
	if got, err := echo("two", 200*time.Millisecond); err == nil {
		t.Fatalf("stalled proxy delivered %q", got)
	}
	p.Resume()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err != nil || got != "two\n" {
		t.Fatalf("after Resume: %q, %v; want the held line", got, err)
	}
	p.Stall()
	if got, err := echo("three", 200*time.Millisecond); err == nil {
		t.Fatalf("stalled proxy delivered %q", got)
	}
	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := r.ReadString('\n'); err == nil {
		t.Fatalf("after Cut: got %q, want the connection closed and the held line lost", got)
	}
}
