package openapitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/errors"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/sqlite"
)

// sampleDoc is a service's own document, before the fragment is added.
const sampleDoc = `{
  "openapi": "3.1.0",
  "info": {"title": "payments", "version": "1.0.0"},
  "paths": {
    "/payments": {
      "post": {
        "operationId": "createPayment",
        "parameters": [{"name": "Idempotency-Key", "in": "header", "schema": {"type": "integer"}}],
        "requestBody": {"required": true, "content": {"application/json": {"schema": {
          "type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer"}}}}}},
        "responses": {
          "201": {"description": "Created", "content": {"application/json": {"schema": {
            "type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}, "amount": {"type": "integer"}}}}}}
        }
      }
    }
  }
}`

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// document merges the fragment of cfg into the sample and returns its JSON
// and a validator of it, after checking it against the OpenAPI 3.1 schema.
func document(t *testing.T, cfg *idemhttp.Options) ([]byte, map[string]any, validator.Validator) {
	t.Helper()
	f, err := idemhttp.OpenAPI(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(sampleDoc), &doc); err != nil {
		t.Fatal(err)
	}
	if err := f.AddTo(doc, "/payments", "POST"); err != nil {
		t.Fatal(err)
	}
	if err := f.AddTo(doc, "/refunds", "POST"); err == nil {
		t.Fatal("AddTo an operation the document lacks: no error")
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	d, err := libopenapi.NewDocument(b)
	if err != nil {
		t.Fatal(err)
	}
	v, errs := validator.NewValidator(d)
	if len(errs) > 0 {
		t.Fatalf("building the validator: %v\n%s", errs, b)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		t.Fatalf("the merged document is not valid OpenAPI 3.1: %s\n%s", describe(verrs), b)
	}
	return b, doc, v
}

func describe(errs []*errors.ValidationError) string {
	var sb strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&sb, "\n  %s: %s", e.Message, e.Reason)
		for _, se := range e.SchemaValidationErrors {
			fmt.Fprintf(&sb, "\n    %s at %s", se.Reason, se.FieldPath+" "+se.KeywordLocation)
		}
	}
	return sb.String()
}

// TestFragmentValidates checks the merged document with libopenapi against
// the OpenAPI 3.1 schema, for the default config and for every option the
// fragment describes, and what the merge put where.
func TestFragmentValidates(t *testing.T) {
	configs := map[string]*idemhttp.Options{
		"nil":     nil,
		"uuid":    {ValidateKey: idemhttp.UUIDKey, InProgressStatus: http.StatusTooEarly, ProblemDocs: "https://docs.example.com/idempotency"},
		"schema":  {KeyHeader: "X-Idempotency-Key", KeyOptional: true, KeySchema: &idemhttp.KeySchema{MinLength: 16, MaxLength: 64, Pattern: "^[A-Za-z0-9_-]+$"}},
		"minimal": {ValidateKey: idemhttp.MinKeyLength(20)},
	}
	for name, cfg := range configs {
		t.Run(name, func(t *testing.T) {
			_, doc, _ := document(t, cfg)
			op := doc["paths"].(map[string]any)["/payments"].(map[string]any)["post"].(map[string]any)
			params := op["parameters"].([]any)
			header := idemhttp.DefaultKeyHeader
			if cfg != nil && cfg.KeyHeader != "" {
				header = cfg.KeyHeader
			}
			var key map[string]any
			for _, p := range params {
				if p := p.(map[string]any); strings.EqualFold(p["name"].(string), header) {
					if key != nil {
						t.Fatalf("two %s parameters: %v", header, params)
					}
					key = p
				}
			}
			if key == nil || key["in"] != "header" || key["required"] != (cfg == nil || !cfg.KeyOptional) {
				t.Fatalf("key parameter %v", key)
			}
			schema := key["schema"].(map[string]any)
			wantMin, wantMax := 1.0, 255.0
			switch name {
			case "uuid":
				wantMin, wantMax = 36, 36
				if schema["format"] != "uuid" || schema["pattern"] == nil {
					t.Errorf("uuid schema %v", schema)
				}
			case "schema":
				wantMin, wantMax = 16, 64
				if schema["pattern"] != "^[A-Za-z0-9_-]+$" {
					t.Errorf("schema %v", schema)
				}
			}
			if schema["minLength"] != wantMin || schema["maxLength"] != wantMax || schema["type"] != "string" {
				t.Errorf("key schema %v; want a string of %v..%v", schema, wantMin, wantMax)
			}
			responses := op["responses"].(map[string]any)
			inProgress := "409"
			if name == "uuid" {
				inProgress = "425"
			}
			for _, code := range []string{"400", inProgress, "413", "422", "429", "503"} {
				r, ok := responses[code].(map[string]any)
				if !ok {
					t.Fatalf("no %s response: %v", code, responses)
				}
				content := r["content"].(map[string]any)
				if _, ok := content["application/problem+json"]; !ok {
					t.Errorf("%s: content %v; want %s", code, content, "application/problem+json")
				}
				headers, _ := r["headers"].(map[string]any)
				_, link := headers["Link"]
				if link != (name == "uuid") {
					t.Errorf("%s: Link header declared %v; want it only with ProblemDocs", code, link)
				}
			}
			if _, ok := responses["409"]; ok && inProgress == "425" {
				t.Error("425 configured, 409 still described")
			}
			created := responses["201"].(map[string]any)["headers"].(map[string]any)
			for _, h := range []string{idemhttp.HeaderReplayed, idemhttp.HeaderKeyExpires} {
				if created[h] == nil {
					t.Errorf("201 lacks the %s header: %v", h, created)
				}
			}
			schemas := doc["components"].(map[string]any)["schemas"].(map[string]any)
			if schemas["IdempotencyProblem"] == nil {
				t.Errorf("components.schemas lacks %s", "IdempotencyProblem")
			}
		})
	}
}

// TestAnswersMatchTheDocument sends real requests to the middleware over
// HTTP, on a SQLite store, and validates every request and answer against
// the merged document with libopenapi-validator: the answers the
// middleware gives are the ones the fragment describes.
func TestAnswersMatchTheDocument(t *testing.T) {
	cfg := &idemhttp.Options{Scope: idemhttp.SharedScope, ValidateKey: idemhttp.UUIDKey,
		ProblemDocs: "https://docs.example.com/idempotency", InProgressStatus: http.StatusTooEarly, MaxRequestBody: 256}
	_, _, v := document(t, cfg)

	db, err := sqlite.Open(ctx(t), filepath.Join(t.TempDir(), "openapi.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := sqlite.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx(t)); err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.New(store, &idempotency.Config{WaitTimeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	entered, release := make(chan struct{}), make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idemhttp.Middleware(g, cfg)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		var in struct{ Amount int }
		_ = json.NewDecoder(r.Body).Decode(&in)
		if in.Amount == 7 { // the held one
			close(entered)
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"amount":%d}`, n, in.Amount)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	send := func(key, body string) (*http.Request, *http.Response) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set(idemhttp.DefaultKeyHeader, key)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		resp.Body = io.NopCloser(bytes.NewReader(b))
		// The validator reads the request as the server got it, on the
		// document's server (none declared: the path alone).
		vreq, _ := http.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		vreq.Header = req.Header.Clone()
		return vreq, resp
	}
	check := func(what string, wantStatus int, key, body string, requestValid bool) *http.Response {
		t.Helper()
		req, resp := send(key, body)
		if resp.StatusCode != wantStatus {
			t.Fatalf("%s: status %d, want %d", what, resp.StatusCode, wantStatus)
		}
		if ok, errs := v.ValidateHttpResponse(req, resp); !ok {
			t.Errorf("%s: the %d answer does not match the document: %s\nheader %v", what, resp.StatusCode, describe(errs), resp.Header)
		}
		if ok, errs := v.ValidateHttpRequest(req); ok != requestValid {
			t.Errorf("%s: the request validates %v against the document, want %v: %s", what, ok, requestValid, describe(errs))
		}
		return resp
	}
	key := "0b6f1c1e-3f58-4d4c-9d61-2b0c3d7b8a11"
	first := check("first", http.StatusCreated, key, `{"amount":5}`, true)
	replay := check("replay", http.StatusCreated, key, `{"amount":5}`, true)
	if replay.Header.Get(idemhttp.HeaderReplayed) != "true" || first.Header.Get(idemhttp.HeaderKeyExpires) == "" {
		t.Errorf("first %v, replay %v", first.Header, replay.Header)
	}
	check("reused", http.StatusUnprocessableEntity, key, `{"amount":6}`, true)
	check("missing", http.StatusBadRequest, "", `{"amount":5}`, false)
	check("not a UUID", http.StatusBadRequest, "order-1", `{"amount":5}`, false)
	check("too large", http.StatusRequestEntityTooLarge, "1b6f1c1e-3f58-4d4c-9d61-2b0c3d7b8a11",
		`{"amount":5,"pad":"`+strings.Repeat("x", 300)+`"}`, true)

	held := "2b6f1c1e-3f58-4d4c-9d61-2b0c3d7b8a11"
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":7}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.DefaultKeyHeader, held)
		if resp, err := srv.Client().Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	busy := check("in progress", http.StatusTooEarly, held, `{"amount":7}`, true)
	close(release)
	<-done
	if busy.Header.Get("Link") == "" || busy.Header.Get("Retry-After") == "" {
		t.Errorf("425 header %v", busy.Header)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2", n)
	}

	// The validator is not lenient: an answer the document does not
	// describe fails.
	req, _ := http.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":5}`))
	bogus := &http.Response{StatusCode: http.StatusConflict, Header: http.Header{"Content-Type": {"text/plain"}},
		Body: io.NopCloser(strings.NewReader("no")), Request: req}
	if ok, _ := v.ValidateHttpResponse(req, bogus); ok {
		t.Error("a 409 text/plain answer validates against a document that describes none")
	}
}
