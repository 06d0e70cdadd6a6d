package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/go-idempotency/idempotency"
)

// The experiment's request: one payment for order 42, then the same key with
// another amount.
const (
	orderID     = 42
	amount      = 100
	otherAmount = 999
	keyScope    = "idemcheck"
)

// reply is what one caller got back.
type reply struct {
	status   int
	body     []byte
	replayed bool
	err      error
}

// outcome is one row of the table: what n simultaneous callers and then one
// caller with another amount got, and the payments in the database.
type outcome struct {
	replies  []reply  // the n simultaneous callers
	payments []string // ids of the payments committed by them
	second   reply    // the same key with otherAmount
	after    int      // payments committed after the second request
}

// naiveOps is the check-then-write version of the operation on one store:
// a key table without a unique constraint, each step its own statement.
type naiveOps struct {
	// lookup reads the stored response for key, if any.
	lookup func(ctx context.Context, key string) (status int, body []byte, found bool, err error)
	// pay inserts one payment and returns its id.
	pay func(ctx context.Context, orderID, amount int) (string, error)
	// save stores key with its response (no unique constraint).
	save func(ctx context.Context, key string, status int, body []byte) error
}

// naiveRequest is the naive operation: check, then write.
func naiveRequest(ctx context.Context, ops naiveOps, key string, amt int) reply {
	status, body, found, err := ops.lookup(ctx, key)
	if err != nil {
		return reply{err: fmt.Errorf("lookup: %w", err)}
	}
	if found {
		return reply{status: status, body: body, replayed: true}
	}
	id, err := ops.pay(ctx, orderID, amt)
	if err != nil {
		return reply{err: fmt.Errorf("payment: %w", err)}
	}
	body = paymentBody(id, amt)
	if err := ops.save(ctx, key, 201, body); err != nil {
		return reply{err: fmt.Errorf("save key: %w", err)}
	}
	return reply{status: 201, body: body}
}

// runNaive runs the naive operation n times at once with one key, then once
// with the same key and another amount.
func runNaive(ctx context.Context, ops naiveOps, n int, payments func(context.Context) ([]string, error)) (outcome, error) {
	key := randomID()
	var out outcome
	out.replies = simultaneously(n, func() reply { return naiveRequest(ctx, ops, key, amount) })
	if err := countPayments(ctx, payments, &out); err != nil {
		return out, err
	}
	out.second = naiveRequest(ctx, ops, key, otherAmount)
	return out, countAfter(ctx, payments, &out)
}

// runLibrary runs [idempotency.Guard.Do] n times at once with one key, then
// once with the same key and another amount. pay inserts one payment through
// tx and returns its id.
func runLibrary[Tx any](ctx context.Context, ks idempotency.KeyStore[Tx], pay func(ctx context.Context, tx Tx, orderID, amount int) (string, error), n int, payments func(context.Context) ([]string, error)) (outcome, error) {
	guard, err := idempotency.New(ks, nil)
	if err != nil {
		return outcome{}, err
	}
	key := idempotency.Key{Scope: keyScope, ID: randomID()}
	request := func(amt int) reply {
		fp, err := idempotency.FingerprintJSON(requestBody(amt))
		if err != nil {
			return reply{err: err}
		}
		resp, err := guard.Do(ctx, key, fp, func(tx Tx) (idempotency.Response, error) {
			id, err := pay(ctx, tx, orderID, amt)
			if err != nil {
				return idempotency.Response{}, err
			}
			return idempotency.Response{Status: 201, Body: paymentBody(id, amt)}, nil
		})
		if err != nil {
			return reply{err: err}
		}
		return reply{status: resp.Status, body: resp.Body, replayed: resp.Replayed}
	}
	var out outcome
	out.replies = simultaneously(n, func() reply { return request(amount) })
	if err := countPayments(ctx, payments, &out); err != nil {
		return out, err
	}
	out.second = request(otherAmount)
	return out, countAfter(ctx, payments, &out)
}

func countPayments(ctx context.Context, payments func(context.Context) ([]string, error), out *outcome) error {
	ids, err := payments(ctx)
	if err != nil {
		return fmt.Errorf("counting payments: %w", err)
	}
	out.payments = ids
	return nil
}

func countAfter(ctx context.Context, payments func(context.Context) ([]string, error), out *outcome) error {
	ids, err := payments(ctx)
	if err != nil {
		return fmt.Errorf("counting payments: %w", err)
	}
	out.after = len(ids)
	return nil
}

// simultaneously calls f from n goroutines released together by a start
// gate, and returns their replies in no particular order.
func simultaneously(n int, f func() reply) []reply {
	replies := make([]reply, n)
	gate := make(chan struct{})
	var ready, done sync.WaitGroup
	ready.Add(n)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			ready.Done()
			<-gate
			replies[i] = f()
		}()
	}
	ready.Wait()
	close(gate)
	done.Wait()
	return replies
}

// requestBody is the JSON body of the request, in the experiment's field order.
func requestBody(amt int) []byte {
	return fmt.Appendf(nil, `{"orderId":%d,"amount":%d}`, orderID, amt)
}

// paymentBody is the 201 response body naming payment id.
func paymentBody(id string, amt int) []byte {
	b, _ := json.Marshal(struct {
		ID      string `json:"id"`
		OrderID int    `json:"orderId"`
		Amount  int    `json:"amount"`
		Status  string `json:"status"`
	}{id, orderID, amt, "approved"})
	return b
}

// randomID returns 16 random hex digits.
func randomID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// paymentsCell is the table's "payments created" cell.
func paymentsCell(o outcome) string { return fmt.Sprint(len(o.payments)) }

// responsesCell summarises the replies: statuses counted, then whether the
// bodies name one payment, then the errors with the first one.
func responsesCell(replies []reply) string {
	counts := map[int]int{}
	bodies := map[string]bool{}
	var errs []error
	for _, r := range replies {
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		counts[r.status]++
		bodies[string(r.body)] = true
	}
	var parts []string
	statuses := make([]int, 0, len(counts))
	for s := range counts {
		statuses = append(statuses, s)
	}
	slices.Sort(statuses)
	for _, s := range statuses {
		parts = append(parts, fmt.Sprintf("%d x %d", counts[s], s))
	}
	switch len(bodies) {
	case 0:
	case 1:
		parts = append(parts, "same payment")
	default:
		parts = append(parts, fmt.Sprintf("%d different payments", len(bodies)))
	}
	cell := strings.Join(parts, ", ")
	if len(errs) > 0 {
		noun := "errors"
		if len(errs) == 1 {
			noun = "error"
		}
		if cell != "" {
			cell += "; "
		}
		cell += fmt.Sprintf("%d %s: %v", len(errs), noun, oneLine(errs[0]))
	}
	return cell
}

// naiveSecondCell says what the naive version did with another amount.
func naiveSecondCell(o outcome) string {
	switch {
	case o.second.err != nil:
		return "error: " + oneLine(o.second.err)
	case o.second.status == 201:
		return "not detected"
	}
	return fmt.Sprint(o.second.status)
}

// librarySecondCell says what the library did with another amount:
// ErrMismatch is the expected 422; anything else is shown as it is.
func librarySecondCell(o outcome) string {
	switch {
	case errors.Is(o.second.err, idempotency.ErrMismatch):
		return "422"
	case o.second.err != nil:
		return "error: " + oneLine(o.second.err)
	}
	return fmt.Sprintf("%d (not refused)", o.second.status)
}

// libraryProblems lists every way the library's row differs from the
// expected: exactly one payment, n x 201 naming it, 422 for another amount.
func libraryProblems(o outcome) []string {
	var p []string
	if len(o.payments) != 1 {
		p = append(p, fmt.Sprintf("%d payments, want 1", len(o.payments)))
	}
	bodies := map[string]bool{}
	for _, r := range o.replies {
		switch {
		case r.err != nil:
			p = append(p, "a caller failed: "+oneLine(r.err))
		case r.status != 201:
			p = append(p, fmt.Sprintf("a caller got status %d, want 201", r.status))
		default:
			bodies[string(r.body)] = true
		}
	}
	if len(bodies) > 1 {
		p = append(p, fmt.Sprintf("%d different bodies, want 1", len(bodies)))
	}
	if len(bodies) == 1 && len(o.payments) == 1 {
		want := string(paymentBody(o.payments[0], amount))
		for b := range bodies {
			if b != want {
				p = append(p, fmt.Sprintf("body %s does not name the payment in the database (want %s)", b, want))
			}
		}
	}
	if !errors.Is(o.second.err, idempotency.ErrMismatch) {
		p = append(p, "the same key with another amount was not refused with 422: "+librarySecondCell(o))
	}
	if o.after != len(o.payments) {
		p = append(p, fmt.Sprintf("the request with another amount changed the payments from %d to %d", len(o.payments), o.after))
	}
	return p
}

// executedReplayed counts how the callers' responses came about.
func executedReplayed(replies []reply) (executed, replayed int) {
	for _, r := range replies {
		switch {
		case r.err != nil:
		case r.replayed:
			replayed++
		default:
			executed++
		}
	}
	return executed, replayed
}

// oneLine keeps an error message on one table line.
func oneLine(err error) string {
	s := strings.Join(strings.Fields(err.Error()), " ")
	return strings.ReplaceAll(s, "|", "/")
}
