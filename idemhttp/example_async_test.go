package idemhttp_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
)

// A report that takes longer than a request: the first POST is answered
// 202 Accepted with the status resource, which answers 202 until the
// operation finished, then its stored answer.
func ExampleAsync() {
	guard, db, cleanup := exampleGuard()
	defer cleanup()
	ready := make(chan struct{})
	statusSecret := []byte("32 random bytes from a vault....") // the same in every instance

	// readme:begin http-async
	report := &idempotency.Operation[*sql.Tx]{
		Name: "report",
		Steps: []idempotency.Step[*sql.Tx]{
			{Name: "render", Foreign: func(ctx context.Context, s *idempotency.State) error {
				<-ready // a long call to another system
				return nil
			}},
		},
		Finish: func(ctx context.Context, tx *sql.Tx, s *idempotency.State) (idempotency.Response, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO payments (amount) VALUES (0)`)
			return idempotency.Response{Status: 201, Body: []byte(`{"report":"ready"}`)}, err
		},
	}
	cfg := &idemhttp.AsyncOptions{
		Options:    &idemhttp.Options{Scope: accountScope},
		StatusPath: "/operations/",
		Secrets:    [][]byte{statusSecret}, // seals the key into the Location
		Wait:       50 * time.Millisecond,  // answer 202 after this
	}
	post, err := idemhttp.Async(guard, report, cfg)
	if err != nil {
		log.Fatal(err) // a bad configuration, refused at start-up
	}
	status, err := idemhttp.AsyncStatus(guard, cfg)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /reports", post)
	mux.Handle("GET /operations/", status)
	// Run a Completer too: it finishes an operation whose process died.
	completer, err := idempotency.NewCompleter(guard, nil, report)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go completer.Serve(ctx)
	// readme:end http-async

	srv := httptest.NewServer(mux)
	defer srv.Close()
	do := func(method, path string) *http.Response {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(`{"month":"2026-11"}`))
		req.Header.Set("Authorization", "Bearer acct-1")
		req.Header.Set("Idempotency-Key", "report-nov")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		return resp
	}
	show := func(resp *http.Response) {
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, string(body))
	}
	accepted := do("POST", "/reports")
	location := accepted.Header.Get("Location") // /operations/ and an opaque id
	fmt.Println("the Location shows the key:", strings.Contains(location, "report-nov"))
	show(accepted)
	show(do("GET", location))
	close(ready)
	for {
		resp := do("GET", location)
		if resp.StatusCode != http.StatusAccepted {
			show(resp)
			break
		}
		resp.Body.Close()
		time.Sleep(10 * time.Millisecond)
	}
	var rows int
	if err := db.QueryRow(`SELECT count(*) FROM payments`).Scan(&rows); err != nil {
		log.Fatal(err)
	}
	fmt.Println("rows:", rows)
	// Output:
	// the Location shows the key: false
	// 202 {"status":"in_progress"}
	// 202 {"status":"in_progress"}
	// 201 {"report":"ready"}
	// rows: 1
}
