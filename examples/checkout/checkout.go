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
}

// newService builds the service and its operation.
func newService[Tx any](g *idempotency.Guard[Tx], tx func(Tx) db, names tables, cfg config, pause *pauser) *service[Tx] {
	s := &service[Tx]{g: g, tx: tx, names: names, pause: pause,
		charges: strings.TrimSuffix(cfg.processor, "/") + "/charges",
		client:  &http.Client{Timeout: cfg.chargeTimeout}}
	s.op = &idempotency.Operation[Tx]{
		Name: "checkout",
		Steps: []idempotency.Step[Tx]{
			{Name: "order", Local: s.insertOrder},
			{Name: "charge", Foreign: s.charge},
			{Name: "receipt", Local: s.insertReceipt},
		},
		Finish: s.finish,
		Lease:  cfg.lease,
	}
	return s
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
		return idempotency.Stop(jsonResponse(http.StatusPaymentRequired, body))
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
const HeaderReplayed = "Idempotent-Replayed"

// ServeHTTP serves POST /checkout.
func (s *service[Tx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/checkout" {
		http.NotFound(w, r)
		return
	}
	key := idempotency.Key{Scope: scope, ID: strings.Trim(r.Header.Get("Idempotency-Key"), `"`)}
	if err := key.Validate(); err != nil {
		problem(w, http.StatusBadRequest, "send an Idempotency-Key header: "+err.Error())
		return
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err != nil {
		problem(w, http.StatusBadRequest, "unreadable body")
		return
	}
	var in order
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil || in.Amount <= 0 || !strings.Contains(in.Email, "@") {
		problem(w, http.StatusBadRequest, `send {"amount": <positive cents>, "email": "<address>"}`)
		return
	}
	fp, err := idempotency.FingerprintJSON(raw)
	if err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		return
	}
	saved, _ := json.Marshal(in)
	resp, err := s.g.Run(r.Context(), key, fp, saved, s.op)
	if err != nil {
		s.fail(w, err)
		return
	}
	if !resp.Replayed {
		// The answer is committed; the client has not got it yet.
		if err := s.pause.at("after:finish", key); err != nil {
			return
		}
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	if resp.Replayed {
		w.Header().Set(HeaderReplayed, "true")
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// fail answers a run that gave no answer: the client may retry with the
// same key (409, 503) unless the request itself is wrong (422).
func (s *service[Tx]) fail(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, idempotency.ErrMismatch):
		problem(w, http.StatusUnprocessableEntity, "this Idempotency-Key was used with another request")
	case errors.Is(err, idempotency.ErrInProgress):
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusConflict, "a request with this Idempotency-Key is in progress; retry later")
	case errors.Is(err, idempotency.ErrUnfinished), errors.Is(err, idempotency.ErrStore), errors.Is(err, context.DeadlineExceeded):
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, "the checkout did not finish; retry with the same Idempotency-Key: "+err.Error())
	default:
		problem(w, http.StatusInternalServerError, err.Error())
	}
}

func problem(w http.ResponseWriter, status int, detail string) {
	body, _ := json.Marshal(map[string]string{"error": detail})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

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
