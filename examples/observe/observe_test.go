package observe_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
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
	"github.com/go-idempotency/idempotency/examples/observe"
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

// accountScope is the example's Options.Scope: the account of the request's
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

	observer, err := observe.New(logger, provider.Meter("payments"))
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
			req.Header.Set(idemhttp.HeaderKey, key)
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
				if m.Name != observe.RequestsMetric {
					continue
				}
				for _, dp := range data.DataPoints {
					o, _ := dp.Attributes.Value("idempotency.outcome")
					s, _ := dp.Attributes.Value("http.response.status_code")
					counts[fmt.Sprintf("%s/%d", o.AsString(), s.AsInt64())] += dp.Value
				}
			case metricdata.Histogram[float64]:
				if m.Name != observe.DurationMetric {
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
