package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/examples/checkout/internal/processor"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/outbox"
)

// scope is the key space of the demo's clients. The demo has no
// authentication: a real service sets the scope to the authenticated
// account, so that two accounts' keys never meet.
const scope = "checkout-demo"

// db is what the steps need of a store's transaction: the two stores' Tx
// types differ (pgx.Tx, *sql.Tx), so each store adapts its own.
type db interface {
	// Exec runs one statement written with ? placeholders.
	Exec(ctx context.Context, query string, args ...any) error
	// WriteEvent writes an outbox event in the transaction.
	WriteEvent(ctx context.Context, ev outbox.Event) error
}

// order is the request body, and the operation's input.
type order struct {
	Amount int64  `json:"amount"`
	Email  string `json:"email"`
}

// receipt is the body of the 201 answer.
type receipt struct {
	OrderID  string `json:"order_id"`
	ChargeID string `json:"charge_id"`
	Amount   int64  `json:"amount"`
	Status   string `json:"status"`
}

// service is the checkout service on one store.
type service[Tx any] struct {
	g       *idempotency.Guard[Tx]
	tx      func(Tx) db
	names   tables
	charges string       // the processor's POST /charges URL
	client  *http.Client // for the processor
	pause   *pauser
	op      *idempotency.Operation[Tx]
	http    http.Handler // idemhttp.Operation of op
}

// newService builds the service, its operation and its HTTP handler; it
// refuses a store that runs no operations.
func newService[Tx any](g *idempotency.Guard[Tx], tx func(Tx) db, names tables, cfg config, pause *pauser) (*service[Tx], error) {
	s := &service[Tx]{g: g, tx: tx, names: names, pause: pause,
		charges: strings.TrimSuffix(cfg.processor, "/") + "/charges",
		client:  &http.Client{Timeout: cfg.chargeTimeout}}
	s.op = &idempotency.Operation[Tx]{
		Name:     "checkout",
		Validate: validate, // before the key is taken: a bad body stores nothing
		Steps: []idempotency.Step[Tx]{
			{Name: "order", Local: s.insertOrder},
			{Name: "charge", Foreign: s.charge},
			{Name: "receipt", Local: s.insertReceipt},
		},
		Finish: s.finish,
		Lease:  cfg.lease,
	}
	h, err := idemhttp.Operation(g, s.op, &idemhttp.Options{
		// The demo has no authentication: a real service returns the
		// authenticated account, so that two accounts' keys never meet.
		Scope:          func(*http.Request) (string, error) { return scope, nil },
		MaxRequestBody: 1 << 16,
		// The body is JSON whatever its Content-Type says: its key order
		// and spacing do not matter.
		Fingerprint: func(_ *http.Request, body []byte) (string, error) { return idempotency.FingerprintJSON(body) },
	})
	if err != nil {
		return nil, err
	}
	s.http = h
	return s, nil
}

// validate is the operation's Validate: the body is an order, with a
// positive amount and an e-mail address, and nothing else.
func validate(_ context.Context, input []byte) error {
	var in order
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil || in.Amount <= 0 || !strings.Contains(in.Email, "@") {
		return errors.New(`send {"amount": <positive cents>, "email": "<address>"}`)
	}
	return nil
}

// insertOrder is the Local step "order": the order row, pending.
func (s *service[Tx]) insertOrder(ctx context.Context, tx Tx, st *idempotency.State) error {
	if err := s.pause.at("before:order", st.Key()); err != nil {
		return err
	}
	in, err := input(st)
	if err != nil {
		return err
	}
	id := "ord_" + randomHex(8)
	if err := s.tx(tx).Exec(ctx, `INSERT INTO `+s.names.Orders+` (id, key_hash, amount, email, status) VALUES (?, ?, ?, ?, 'pending')`,
		id, st.Key().Hash(), in.Amount, in.Email); err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	st.Set("order", id)
	return nil
}

// charge is the Foreign step "charge": POST /charges at the processor with
// a key derived from the operation's, so that a second call (after a crash)
// is the same charge. A decline is noted for the next step.
func (s *service[Tx]) charge(ctx context.Context, st *idempotency.State) error {
	if err := s.pause.at("after:order", st.Key()); err != nil {
		return err
	}
	in, err := input(st)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(processor.Request{Amount: in.Amount, Reference: st.Get("order")})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.charges, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(processor.HeaderKey, st.Key().Derive("charge"))
	if err := s.pause.at("charge:send", st.Key()); err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("processor: %w", err)
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return fmt.Errorf("processor: read the answer: %w", err)
	}
	switch resp.StatusCode {
	case http.StatusCreated:
		var c processor.Charge
		if err := json.Unmarshal(reply, &c); err != nil || c.ID == "" {
			return fmt.Errorf("processor: unreadable charge %q", reply)
		}
		st.Set("charge", c.ID)
		return nil
	case http.StatusPaymentRequired:
		st.Set("declined", "card_declined")
		return nil
	}
	// 503, 409, a 422 (a bug: the charge's body changed): transient here,
	// so the key stays unfinished for a retry, the completer, an operator.
	return fmt.Errorf("processor: status %d: %s", resp.StatusCode, bytes.TrimSpace(reply))
}

// insertReceipt is the Local step "receipt": the receipt row of the
// charge, or the order marked declined and the operation stopped with 402.
func (s *service[Tx]) insertReceipt(ctx context.Context, tx Tx, st *idempotency.State) error {
	if err := s.pause.at("before:receipt", st.Key()); err != nil {
		return err
	}
	d := s.tx(tx)
	if st.Get("declined") != "" {
		if err := d.Exec(ctx, `UPDATE `+s.names.Orders+` SET status = 'declined' WHERE id = ?`, st.Get("order")); err != nil {
			return fmt.Errorf("decline order: %w", err)
		}
		body, _ := json.Marshal(map[string]string{"order_id": st.Get("order"), "status": "declined", "error": st.Get("declined")})
		return idempotency.FinalAnswer(jsonResponse(http.StatusPaymentRequired, body))
	}
	in, err := input(st)
	if err != nil {
		return err
	}
	if err := d.Exec(ctx, `INSERT INTO `+s.names.Receipts+` (order_id, key_hash, charge_id, amount) VALUES (?, ?, ?, ?)`,
		st.Get("order"), st.Key().Hash(), st.Get("charge"), in.Amount); err != nil {
		return fmt.Errorf("insert receipt: %w", err)
	}
	if err := d.Exec(ctx, `UPDATE `+s.names.Orders+` SET status = 'paid' WHERE id = ?`, st.Get("order")); err != nil {
		return fmt.Errorf("pay order: %w", err)
	}
	return nil
}

// finish is the last local phase: the e-mail event in the outbox, and the
// answer, stored with the key.
func (s *service[Tx]) finish(ctx context.Context, tx Tx, st *idempotency.State) (idempotency.Response, error) {
	if err := s.pause.at("after:receipt", st.Key()); err != nil {
		return idempotency.Response{}, err
	}
	in, err := input(st)
	if err != nil {
		return idempotency.Response{}, err
	}
	body, _ := json.Marshal(receipt{OrderID: st.Get("order"), ChargeID: st.Get("charge"), Amount: in.Amount, Status: "paid"})
	mail, _ := json.Marshal(map[string]any{"to": in.Email, "order_id": st.Get("order"), "charge_id": st.Get("charge"), "amount": in.Amount})
	ev := outbox.Event{Key: st.Key(), Purpose: "receipt-email", Subject: "email.receipt", Payload: mail}
	if err := s.tx(tx).WriteEvent(ctx, ev); err != nil {
		return idempotency.Response{}, err
	}
	return jsonResponse(http.StatusCreated, body), nil
}

func input(st *idempotency.State) (order, error) {
	var in order
	if err := json.Unmarshal(st.Input(), &in); err != nil {
		return order{}, fmt.Errorf("the operation's input: %w", err)
	}
	return in, nil
}

func jsonResponse(status int, body []byte) idempotency.Response {
	return idempotency.Response{Status: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// HeaderReplayed is set to "true" on a stored answer sent again.
const HeaderReplayed = idemhttp.HeaderReplayed

// ServeHTTP serves POST /checkout with idemhttp.Operation: it validates
// the body (400, nothing stored), runs the operation under the request's
// key and answers its result (201, or a stored 402), or a problem the
// client may retry with the same key (409 in progress, 503 a step failed
// or the store did) unless the request itself is wrong (422 the key was
// used with another body).
func (s *service[Tx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/checkout" {
		http.NotFound(w, r)
		return
	}
	key := idempotency.Key{Scope: scope, ID: strings.Trim(r.Header.Get("Idempotency-Key"), `"`)}
	s.http.ServeHTTP(&finished{ResponseWriter: w, pause: s.pause, key: key}, r)
}

// finished holds an answer the run just committed (not a replay, not a
// problem) at the pause point "after:finish", before the client gets it.
type finished struct {
	http.ResponseWriter
	pause *pauser
	key   idempotency.Key
}

// WriteHeader pauses before a fresh 201 or 402 is sent.
func (f *finished) WriteHeader(status int) {
	if (status == http.StatusCreated || status == http.StatusPaymentRequired) && f.Header().Get(HeaderReplayed) == "" {
		// The answer is committed; the client has not got it yet.
		if err := f.pause.at("after:finish", f.key); err != nil {
			panic(http.ErrAbortHandler) // shutting down: the client gets no answer
		}
	}
	f.ResponseWriter.WriteHeader(status)
}

// Unwrap lets http.ResponseController reach the writer underneath.
func (f *finished) Unwrap() http.ResponseWriter { return f.ResponseWriter }

// complete runs c every interval until ctx ends, logging what each pass
// that found keys did.
func complete[Tx any](ctx context.Context, c *idempotency.Completer[Tx], interval time.Duration, logf func(string, ...any)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rep, err := c.Once(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			logf("completer: %v", err)
		case rep.Listed > 0:
			logf("completer: %d abandoned: %d finished, %d failed, %d exhausted, %d skipped (%v)",
				rep.Listed, rep.Finished, rep.Failed, rep.Exhausted, rep.Skipped, rep.Duration.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
