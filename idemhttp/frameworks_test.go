package idemhttp_test

import (
	"database/sql"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/frameworktest"
)

// serveMux mounts the middleware per route on an http.ServeMux.
type serveMux struct{}

func (serveMux) SQLite(t *testing.T, g *idempotency.Guard[*sql.Tx], o *idemhttp.Options, h frameworktest.Handlers) string {
	return startMux(t, g, o, h)
}

func (serveMux) Postgres(t *testing.T, g *idempotency.Guard[pgx.Tx], o *idemhttp.Options, h frameworktest.Handlers) string {
	return startMux(t, g, o, h)
}

func startMux[Tx any](t *testing.T, g *idempotency.Guard[Tx], o *idemhttp.Options, h frameworktest.Handlers) string {
	mw := idemhttp.Middleware(g, o)
	mux := http.NewServeMux()
	route := func(path string, f func(w http.ResponseWriter, r *http.Request, n int64)) {
		mux.Handle("POST "+path, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := h.Run()
			if err := h.Effect(r.Context()); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			f(w, r, n)
		})))
	}
	route(frameworktest.RouteWrite, func(w http.ResponseWriter, r *http.Request, n int64) {
		b, _ := json.Marshal(frameworktest.Body(n))
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/things/"+strconv.FormatInt(n, 10))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(b)
	})
	route(frameworktest.RouteError, func(w http.ResponseWriter, r *http.Request, _ int64) {
		http.Error(w, "upstream failed", http.StatusBadGateway)
	})
	route(frameworktest.RoutePanic, func(w http.ResponseWriter, r *http.Request, _ int64) { panic("handler bug") })
	route(frameworktest.RouteNothing, func(w http.ResponseWriter, r *http.Request, _ int64) {})
	route(frameworktest.RouteBind, func(w http.ResponseWriter, r *http.Request, _ int64) {
		var in struct{ Amount int }
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic route logs
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestServeMux runs the framework suite on net/http's ServeMux, the
// middleware mounted per route.
func TestServeMux(t *testing.T) {
	t.Parallel()
	frameworktest.Run(t, serveMux{})
}
