package idemhttp_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
)

// A payment in two steps, answered in the request: an invalid body is
// refused before the key is taken, so the corrected body runs with the
// same key.
func ExampleOperation() {
	guard, _, cleanup := exampleGuard()
	defer cleanup()

	// readme:begin http-operation
	type payment struct {
		Amount int64 `json:"amount"`
	}
	pay := &idempotency.Operation[*sql.Tx]{
		Name: "pay",
		// Before the key is taken: an error is a 400 with its text, and
		// nothing is stored.
		Validate: func(ctx context.Context, input []byte) error {
			var p payment
			if err := json.Unmarshal(input, &p); err != nil || p.Amount <= 0 {
				return errors.New(`send {"amount": <positive cents>}`)
			}
			return nil
		},
		Steps: []idempotency.Step[*sql.Tx]{
			{Name: "order", Local: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) error {
				var p payment
				_ = json.Unmarshal(s.Input(), &p) // Validate accepted it
				_, err := tx.ExecContext(ctx, `INSERT INTO payments (amount) VALUES (?)`, p.Amount)
				return err
			}},
			{Name: "charge", Foreign: func(ctx context.Context, s *idempotency.State) error {
				return nil // the card processor, with Idempotency-Key: s.Key().Derive("charge")
			}},
		},
		Finish: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) (idempotency.Response, error) {
			return idempotency.Response{Status: 201, Body: []byte(`{"paid":true}`)}, nil
		},
	}
	h, err := idemhttp.Operation(guard, pay, &idemhttp.Options{Scope: accountScope})
	if err != nil {
		log.Fatal(err) // a bad configuration, refused at start-up
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", h)
	// readme:end http-operation

	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, body := range []string{`{"amount":0}`, `{"amount":1999}`, `{"amount":1999}`} {
		req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer acct-1")
		req.Header.Set("Idempotency-Key", "pay-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusBadRequest {
			var p idemhttp.Problem
			_ = json.Unmarshal(b, &p)
			b = []byte(p.Detail)
		}
		fmt.Println(resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), string(b))
	}
	// Output:
	// 400  send {"amount": <positive cents>}
	// 201  {"paid":true}
	// 201 true {"paid":true}
}
