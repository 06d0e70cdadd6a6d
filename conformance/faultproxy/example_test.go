package faultproxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/go-idempotency/idempotency/conformance/faultproxy"
)

// Example loses the reply to a client's second request: the server
// executed it, the client sees its connection closed.
func Example() {
	// A server that answers every line with "ok:" and the line.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	go func() {
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
					fmt.Printf("server executed %q\n", strings.TrimSpace(line))
					_, _ = io.WriteString(c, "ok:"+line)
				}
			}()
		}
	}()

	p, err := faultproxy.New(ln.Addr().String(), nil)
	if err != nil {
		panic(err)
	}
	defer p.Close()
	if _, err := p.Arm(faultproxy.Fault{Step: 2, Action: faultproxy.CutAfter}); err != nil {
		panic(err)
	}

	c, err := net.Dial("tcp", p.Addr()) // the client dials the proxy
	if err != nil {
		panic(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	for _, req := range []string{"reserve", "commit"} {
		_, _ = io.WriteString(c, req+"\n")
		reply, err := r.ReadString('\n')
		fmt.Printf("client got %q, %v\n", strings.TrimSpace(reply), err)
	}
	st, _ := p.Fired()
	fmt.Printf("fault fired at step %d of connection %d\n", st.N, st.Conn)
	// Output:
	// server executed "reserve"
	// client got "ok:reserve", <nil>
	// server executed "commit"
	// client got "", EOF
	// fault fired at step 2 of connection 1
}
