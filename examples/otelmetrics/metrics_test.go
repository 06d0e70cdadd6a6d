package otelmetrics_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/examples/otelmetrics"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/sqlite"
)

// TestSevenMetrics drives a known sequence of requests and one purge, then
// reads each of the seven metrics, through the OpenTelemetry SDK and
// through the Prometheus exporter, and checks its exact value: 2 new keys,
// 2 replays, 1 payload conflict, 1 in-progress refusal and 2 waits, 1
// replay from the store aged 1 hour, 1 failure after the handler ran, 2
// records purged in 2 batches.
func TestSevenMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The store's clock runs an hour behind, then two days ahead: records
	// are an hour old when replayed, and expired for the purge.
	var behind atomic.Int64
	behind.Store(int64(time.Hour))
	db, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "metrics.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store, err := sqlite.New(db, &sqlite.Config{Clock: func() time.Time { return time.Now().Add(-time.Duration(behind.Load())) }})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	// readme:begin http-metrics
	registry := prometheus.NewRegistry() // served by promhttp.HandlerFor(registry, ...)
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		t.Fatal(err)
	}
	reader := sdkmetric.NewManualReader() // or any other OpenTelemetry reader
	meter := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter), sdkmetric.WithReader(reader)).Meter("payments")

	purges, err := otelmetrics.Guard(nil, meter) // purge batches
	if err != nil {
		t.Fatal(err)
	}
	guard, err := idempotency.New(store, &idempotency.Config{Observer: purges, PurgeBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	requests, err := otelmetrics.New(nil, meter) // requests, waits, replay age, failures after fn
	if err != nil {
		t.Fatal(err)
	}
	mw := idemhttp.Middleware(guard, &idemhttp.Options{Scope: idemhttp.SharedScope, Observer: requests})
	// readme:end http-metrics

	// A second instance on the same store that waits 50ms at most.
	impatient, err := idempotency.New(store, &idempotency.Config{WaitTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var slowStarted sync.Once
	started := make(chan struct{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			slowStarted.Do(func() { close(started) })
			<-release
		case "/rollback": // a buggy handler: its commit will fail
			tx, ok := idempotency.TxFrom[*sql.Tx](r.Context())
			if !ok {
				http.Error(w, "not guarded", http.StatusInternalServerError)
				return
			}
			_ = tx.Rollback()
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"ok":true}`)
	})
	srv := httptest.NewServer(mw(handler))
	defer srv.Close()
	other := httptest.NewServer(idemhttp.Middleware(impatient, &idemhttp.Options{Scope: idemhttp.SharedScope, Observer: requests})(handler))
	defer other.Close()
	send := func(base, path, key, body string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.DefaultKeyHeader, key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	statuses := []int{
		send(srv.URL, "/pay", "k1", `{"a":1}`), // new key
		send(srv.URL, "/pay", "k1", `{"a":1}`), // replay from the store, 1h old
		send(srv.URL, "/pay", "k1", `{"a":2}`), // payload conflict
	}
	var wg sync.WaitGroup
	var held, waiter, refused int
	wg.Go(func() { held = send(srv.URL, "/slow", "k2", `{}`) })
	<-started
	wg.Go(func() { waiter = send(srv.URL, "/slow", "k2", `{}`) })    // waits in memory, then replays
	wg.Go(func() { refused = send(other.URL, "/slow", "k2", `{}`) }) // waits 50ms, then 409
	time.Sleep(300 * time.Millisecond)
	close(release)
	wg.Wait()
	statuses = append(statuses, held, waiter, refused, send(srv.URL, "/rollback", "k3", `{}`))
	if want := []int{201, 201, 422, 201, 201, 409, 503}; fmt.Sprint(statuses) != fmt.Sprint(want) {
		t.Fatalf("statuses %v, want %v", statuses, want)
	}
	behind.Store(-int64(48 * time.Hour))
	if n, err := guard.Purge(ctx); err != nil || n != 2 {
		t.Fatalf("Purge: %d, %v; want 2 (k1, k2)", n, err)
	}

	// Through the OpenTelemetry SDK.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					o, _ := dp.Attributes.Value("idempotency.outcome")
					got[m.Name+"/"+o.AsString()] = fmt.Sprint(toInt(got[m.Name+"/"+o.AsString()]) + dp.Value)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					o, _ := dp.Attributes.Value("idempotency.outcome")
					got[m.Name+"/"+o.AsString()+"#count"] = fmt.Sprint(dp.Count)
					got[m.Name+"/"+o.AsString()+"#sum"] = fmt.Sprint(dp.Sum)
				}
			}
		}
	}
	checkSeven(t, "OpenTelemetry", got, map[string]string{
		"new keys":              otelmetrics.RequestsMetric + "/executed",
		"replays":               otelmetrics.RequestsMetric + "/replayed",
		"payload conflicts":     otelmetrics.RequestsMetric + "/mismatch",
		"in-progress refusals":  otelmetrics.RequestsMetric + "/in_progress",
		"waits ending replayed": otelmetrics.WaitMetric + "/replayed",
		"waits running out":     otelmetrics.WaitMetric + "/in_progress",
		"replay age":            otelmetrics.ReplayAgeMetric + "/",
		"failures after fn":     otelmetrics.FailuresAfterFnMetric + "/",
		"purged records":        otelmetrics.PurgeDeletedMetric + "/",
		"purge batches":         otelmetrics.PurgeDurationMetric + "/",
	})

	// Through Prometheus: the registry a /metrics endpoint serves.
	families, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	prom := map[string]string{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			name := mf.GetName() + "/" + label(m, "idempotency_outcome")
			switch {
			case m.GetCounter() != nil:
				prom[name] = fmt.Sprint(toInt(prom[name]) + int64(m.GetCounter().GetValue()))
			case m.GetHistogram() != nil:
				prom[name+"#count"] = fmt.Sprint(m.GetHistogram().GetSampleCount())
				prom[name+"#sum"] = fmt.Sprint(m.GetHistogram().GetSampleSum())
			}
		}
	}
	checkSeven(t, "Prometheus", prom, map[string]string{
		"new keys":              "idempotency_http_requests_total/executed",
		"replays":               "idempotency_http_requests_total/replayed",
		"payload conflicts":     "idempotency_http_requests_total/mismatch",
		"in-progress refusals":  "idempotency_http_requests_total/in_progress",
		"waits ending replayed": "idempotency_http_wait_seconds/replayed",
		"waits running out":     "idempotency_http_wait_seconds/in_progress",
		"replay age":            "idempotency_replay_age_seconds/",
		"failures after fn":     "idempotency_failures_after_fn_total/",
		"purged records":        "idempotency_purge_deleted_total/",
		"purge batches":         "idempotency_purge_duration_seconds/",
	})
	// The text a scrape returns has them too, and no key as a label.
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(registry, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	text := rec.Body.String()
	for _, line := range []string{
		`idempotency_failures_after_fn_total{otel_scope_name="payments"`,
		`idempotency_purge_deleted_total{otel_scope_name="payments"`,
	} {
		if !strings.Contains(text, line) {
			t.Errorf("the scrape has no %s", line)
		}
	}
	for _, key := range []string{"k1", "k2", "k3", idempotency.Key{ID: "k1"}.Hash()} {
		if strings.Contains(text, `"`+key+`"`) {
			t.Errorf("the scrape has the key %q as a label value", key)
		}
	}
}

// checkSeven checks the values of the seven metrics in got, named by where.
func checkSeven(t *testing.T, source string, got, where map[string]string) {
	t.Helper()
	exact := map[string]string{
		"new keys": "2", "replays": "2", "payload conflicts": "1", "in-progress refusals": "1",
		"waits ending replayed#count": "1", "waits running out#count": "1",
		"replay age#count": "1", "failures after fn": "1", "purged records": "2", "purge batches#count": "2",
	}
	names := make([]string, 0, len(exact))
	for n := range exact {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		metric, suffix, _ := strings.Cut(n, "#")
		key := where[metric]
		if suffix != "" {
			key += "#" + suffix
		}
		if got[key] != exact[n] {
			t.Errorf("%s: %s (%s) = %q, want %s", source, metric, key, got[key], exact[n])
		}
	}
	// The sums: the replay was an hour old; the waits lasted about 300ms
	// (until the holder answered) and 50ms (the impatient bound).
	for metric, want := range map[string][2]float64{
		"replay age":            {3600, 3660},
		"waits ending replayed": {0.15, 10},
		"waits running out":     {0.04, 10},
	} {
		sum := toFloat(got[where[metric]+"#sum"])
		if sum < want[0] || sum > want[1] {
			t.Errorf("%s: %s sum %v, want in %v", source, metric, sum, want)
		}
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func toInt(s string) int64 {
	var n int64
	fmt.Sscan(s, &n)
	return n
}

func toFloat(s string) float64 {
	f := math.NaN()
	fmt.Sscan(s, &f)
	return f
}
