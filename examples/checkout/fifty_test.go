package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency/internal/testkit"
)

// fiftyKills is how many times TestFiftyKills kills the service.
const fiftyKills = 50

// TestFiftyKills runs the service on each SQL store while clients send
// checkouts with distinct keys and retry them, and kills it with SIGKILL
// 50 times at random points (seeded: CHECKOUT_SEED=N replays a run), one
// process after another. Then a last process's Completer finishes every
// unfinished key, with no client; then every key is completed (a last
// retry runs the keys no run ever committed), the processor made one
// charge per paid key, the tables hold one set of rows per key, and every
// answer a client got is the stored one (or a 409, a 503, a refused or cut
// connection).
func TestFiftyKills(t *testing.T) {
	t.Parallel()
	for _, sk := range storeKinds {
		t.Run(sk.name, func(t *testing.T) {
			t.Parallel()
			fifty(t, sk)
		})
	}
}

// killPoints are where TestFiftyKills kills: a pause point, the
// processor's held answer, or anywhere ("" : after a random delay).
var killPoints = append([]string{chargeRecorded, ""}, pausePoints...)

func fifty(t *testing.T, sk storeKind) {
	serviceBinary(t)
	start := time.Now()
	ctx := testkit.Context(t, 5*time.Minute)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CHECKOUT_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("CHECKOUT_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (CHECKOUT_SEED=%d replays the kill points)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	f := newFixture(t, ctx, sk)
	f.proc.Decline(declinedAmount)
	addr := freeAddr(t)
	url := "http://" + addr
	run := testkit.Name("k50-")

	// The clients: 4 workers, each taking the next key and retrying it
	// until it gets a stored answer or the kills are over.
	var (
		mu      sync.Mutex
		next    int
		answers = map[int][]answer{}
	)
	amountOf := func(i int) int64 {
		if i%10 == 9 {
			return declinedAmount
		}
		return int64(1000 + i)
	}
	idOf := func(i int) string { return run + "-" + strconv.Itoa(i) }
	clients, stopClients := context.WithCancel(ctx)
	defer stopClients()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for clients.Err() == nil {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				for clients.Err() == nil {
					a := post(clients, url, idOf(i), amountOf(i))
					if clients.Err() != nil {
						break // cut by the end of the kills: not an answer
					}
					mu.Lock()
					answers[i] = append(answers[i], a)
					mu.Unlock()
					if a.final() || !a.allowed() {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}

	// The kills.
	var log []string
	for k := range fiftyKills {
		point := killPoints[rng.IntN(len(killPoints))]
		nth := 1 + rng.IntN(3)
		delay := time.Duration(50+rng.IntN(400)) * time.Millisecond
		o := serviceOpts{addr: addr}
		var blk interface{ Release() }
		var recorded <-chan string
		var marks <-chan string
		switch point {
		case chargeRecorded:
			b := f.proc.BlockNext()
			blk, recorded = b, b.Recorded()
		case "":
		default:
			o.pauseAt = point + "@" + strconv.Itoa(nth)
		}
		s := f.start(ctx, o)
		marks = s.marks
		how := ""
		select {
		case m := <-marks:
			how = m
		case key := <-recorded:
			how = "charge recorded for " + key[:8] + "..."
		case <-time.After(delay):
			if point == "" {
				how = fmt.Sprintf("after %v", delay)
				break
			}
			select { // the point may take longer to reach
			case m := <-marks:
				how = m
			case key := <-recorded:
				how = "charge recorded for " + key[:8] + "..."
			case <-time.After(5 * time.Second):
				how = "no pause at " + point + " in 5s"
			}
		}
		s.kill()
		if blk != nil {
			blk.Release()
		}
		log = append(log, fmt.Sprintf("kill %d: %s", k+1, how))
	}
	stopClients()
	wg.Wait()
	t.Logf("%d kills in %v, %d keys sent", fiftyKills, time.Since(start).Round(time.Millisecond), next)
	for _, l := range log {
		t.Log(l)
	}

	// The last process: its Completer alone finishes the unfinished keys.
	last := f.start(ctx, serviceOpts{addr: addr, grace: 100 * time.Millisecond})
	testkit.WaitUntil(t, 60*time.Second, "the Completer finishing every unfinished key", func() bool {
		st, err := f.app.stats(ctx)
		return err == nil && st.Unfinished == 0 && st.InProgress == 0
	})
	t.Logf("the Completer finished in %v", time.Since(start).Round(time.Millisecond))
	// A last request for every key: a replay, or the run of a key that no
	// run ever committed (killed before its first step's commit).
	paid, declined := 0, 0
	for i := range next {
		a := post(ctx, url, idOf(i), amountOf(i))
		answers[i] = append(answers[i], a)
		if !a.final() {
			t.Errorf("key %d: the last request got %v", i, a)
		}
		if amountOf(i) == declinedAmount {
			declined++
		} else {
			paid++
		}
	}
	last.stop()
	for i := range next {
		f.checkKey(ctx, idOf(i), amountOf(i) == declinedAmount, answers[i])
	}
	if f.proc.Charges() != paid || f.proc.Declines() != declined {
		t.Errorf("the processor made %d charges and %d declines, want %d and %d", f.proc.Charges(), f.proc.Declines(), paid, declined)
	}
	n, err := f.app.count(ctx, "SELECT count(*) FROM "+newTables(f.prefix).Orders)
	if err != nil || n != next {
		t.Errorf("%d orders in all (%v), want %d", n, err, next)
	}
	st, err := f.app.stats(ctx)
	if err != nil || st.Completed != int64(next) {
		t.Errorf("stats %+v (%v), want %d completed keys", st, err, next)
	}
	t.Logf("%d keys (%d paid, %d declined) checked in %v", next, paid, declined, time.Since(start).Round(time.Millisecond))
}
