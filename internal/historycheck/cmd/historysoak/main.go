// Command historysoak records seeded histories of concurrent calls with
// faults on each store and checks them with porcupine (package
// historycheck): a night's soak of what CI runs a few hundred of.
//
//	go run ./cmd/historysoak -n 10000                  # every store
//	go run ./cmd/historysoak -store redis -n 10000 -from 20000
//
// The servers are named by the variables the tests read
// (IDEMPOTENCY_POSTGRES_DSN, IDEMPOTENCY_MYSQL_DSN, IDEMPOTENCY_REDIS_ADDR);
// a store whose variable is not set is skipped. It prints, per store, the
// histories, calls, unknown outcomes, violations (each with the calls of
// the key that broke a rule) and the time spent checking, and exits 1 if
// any history broke a rule, 2 if it could not run.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency/conformance"
	"github.com/go-idempotency/idempotency/internal/historycheck"
)

func main() {
	os.Exit(run())
}

func run() int {
	stores := flag.String("store", strings.Join(historycheck.Stores, ","), "stores to run on, comma-separated")
	n := flag.Uint64("n", 10000, "histories per store")
	from := flag.Uint64("from", 1, "number of the first history")
	lanes := flag.Int("lanes", 4, "histories recorded at once per store")
	timeout := flag.Duration("timeout", 10*time.Second, "bound of porcupine's check of one history")
	flag.Parse()
	historycheck.Quiet()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	code := 0
	for _, s := range strings.Split(*stores, ",") {
		recs, closeAll, err := historycheck.Lanes(ctx, s, *lanes, nil)
		if errors.Is(err, historycheck.ErrNoServer) {
			fmt.Printf("%s: skipped (%v)\n", s, err)
			continue
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", s, err)
			return 2
		}
		last := time.Now()
		sum, err := historycheck.Run(ctx, recs, *from, *n, *timeout, func(h conformance.History, _ historycheck.Result) {
			if time.Since(last) > 30*time.Second {
				last = time.Now()
				fmt.Printf("%s: history %d\n", s, h.Number)
			}
		})
		closeAll()
		for _, v := range sum.Violations {
			fmt.Printf("%s: VIOLATION %s", s, v)
		}
		fmt.Printf("%s: %v\n", s, sum)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", s, err)
			return 2
		}
		if len(sum.Violations) > 0 {
			code = 1
		}
	}
	return code
}
