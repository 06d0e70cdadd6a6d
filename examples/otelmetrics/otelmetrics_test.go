package otelmetrics_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/examples/otelmetrics"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/sqlite"
)

// newGuard returns a guard on a fresh SQLite file, and its database.
func newGuard(t *testing.T, ctx context.Context) (*idempotency.Guard[*sql.Tx], *sql.DB) {
	t.Helper()
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "observe.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := sqlite.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.New(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	return g, db
}

// accountScope is the example's Config.Scope: the account of the request's
// credential, as the service's authentication verified it (here, standing
// for it, the bearer token), and 401 without one.
func accountScope(r *http.Request) (string, error) {
	if acct := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "); acct != "" {
		return acct, nil
	}
	return "", &idemhttp.Problem{Type: "about:blank", Title: "Unauthorized", Status: http.StatusUnauthorized}
}

func TestObserver(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	guard, db := newGuard(t, ctx)

	// readme:begin http-observe
	reader := sdkmetric.NewManualReader() // in production: a periodic reader and an exporter
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	observer, err := otelmetrics.New(logger, provider.Meter("payments"))
	if err != nil {
		t.Fatal(err)
	}
	mw := idemhttp.Middleware(guard, &idemhttp.Options{Scope: accountScope, Observer: observer})
	// readme:end http-observe

	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	send := func(path, key string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer acct_1")
		if key != "" {
			req.Header.Set(idemhttp.DefaultKeyHeader, key)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	statuses := []int{send("/pay", "k1"), send("/pay", "k1"), send("/pay", ""), send("/fail", "k2")}
	db.Close() // the store fails from now on
	statuses = append(statuses, send("/pay", "k3"))
	if want := []int{201, 201, 400, 502, 503}; fmt.Sprint(statuses) != fmt.Sprint(want) {
		t.Fatalf("statuses %v, want %v", statuses, want)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	var histCount uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				if m.Name != otelmetrics.RequestsMetric {
					continue
				}
				for _, dp := range data.DataPoints {
					o, _ := dp.Attributes.Value("idempotency.outcome")
					s, _ := dp.Attributes.Value("http.response.status_code")
					counts[fmt.Sprintf("%s/%d", o.AsString(), s.AsInt64())] += dp.Value
				}
			case metricdata.Histogram[float64]:
				if m.Name != otelmetrics.DurationMetric {
					continue
				}
				for _, dp := range data.DataPoints {
					histCount += dp.Count
					if dp.Sum <= 0 {
						t.Errorf("duration sum %v for %v", dp.Sum, dp.Attributes)
					}
				}
			}
		}
	}
	want := map[string]int64{"executed/201": 1, "replayed/201": 1, "rejected/400": 1, "handler_error/502": 1, "store_error/503": 1}
	if fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Errorf("counter %v, want %v", counts, want)
	}
	if histCount != 5 {
		t.Errorf("histogram has %d observations, want 5", histCount)
	}

	var lines []map[string]any
	dec := json.NewDecoder(&logs)
	for dec.More() {
		var l map[string]any
		if err := dec.Decode(&l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	if len(lines) != 5 {
		t.Fatalf("%d log lines, want 5: %v", len(lines), lines)
	}
	if lines[4]["level"] != "ERROR" || lines[4]["outcome"] != "store_error" || lines[4]["error"] == nil || lines[2]["level"] != "INFO" || lines[0]["level"] != "DEBUG" {
		t.Errorf("log lines %v", lines)
	}
}

// TestObserverLogsKeyHash: the log lines name each request's key by
// key_hash (the hash of its scope and id), never by the raw key or scope,
// also in the error of a failing store; and no answer to the client
// (problem details included) carries the key or its hash.
func TestObserverLogsKeyHash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	guard, db := newGuard(t, ctx)
	const scope, id, other = "tenant-secret-7", "order-42-secret", "order-43-secret"
	var logs bytes.Buffer
	observer, err := otelmetrics.New(slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})), nil)
	if err != nil {
		t.Fatal(err)
	}
	mw := idemhttp.Middleware(guard, &idemhttp.Options{Observer: observer,
		Scope: func(*http.Request) (string, error) { return scope, nil }})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	var bodies []string
	send := func(key, body string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.DefaultKeyHeader, key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		bodies = append(bodies, string(b))
		return resp.StatusCode
	}
	statuses := []int{send(id, `{"a":1}`), send(id, `{"a":1}`), send(id, `{"a":2}`)}
	db.Close() // the store fails from now on
	statuses = append(statuses, send(other, `{}`))
	if want := []int{201, 201, 422, 503}; fmt.Sprint(statuses) != fmt.Sprint(want) {
		t.Fatalf("statuses %v, want %v", statuses, want)
	}
	out := logs.String()
	for _, raw := range []string{scope, id, other} {
		if strings.Contains(out, raw) {
			t.Errorf("the log carries the raw %q:\n%s", raw, out)
		}
	}
	hashes := []string{
		idempotency.Key{Scope: scope, ID: id}.Hash(), idempotency.Key{Scope: scope, ID: id}.Hash(),
		idempotency.Key{Scope: scope, ID: id}.Hash(), idempotency.Key{Scope: scope, ID: other}.Hash(),
	}
	for i, b := range bodies {
		for _, s := range []string{scope, id, other, hashes[i]} {
			if strings.Contains(b, s) {
				t.Errorf("answer %d carries %q: %s", i, s, b)
			}
		}
	}
	var lines []map[string]any
	dec := json.NewDecoder(&logs)
	for dec.More() {
		var l map[string]any
		if err := dec.Decode(&l); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, l)
	}
	if len(lines) != len(hashes) {
		t.Fatalf("%d log lines, want %d:\n%s", len(lines), len(hashes), out)
	}
	for i, l := range lines {
		if l["key_hash"] != hashes[i] {
			t.Errorf("line %d: key_hash %v, want %s: %v", i, l["key_hash"], hashes[i], l)
		}
	}
	if e, _ := lines[3]["error"].(string); !strings.Contains(e, hashes[3]) {
		t.Errorf("the store error %q does not name the key's hash %s", e, hashes[3])
	}
}
