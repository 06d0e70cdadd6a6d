package chiexample_test

import (
	"database/sql"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/internal/frameworktest"
)

type mount struct{}

func (mount) SQLite(t *testing.T, g *idempotency.Guard[*sql.Tx], o *idemhttp.Options, h frameworktest.Handlers) string {
	return start(t, idemhttp.Middleware(g, o), h)
}

func (mount) Postgres(t *testing.T, g *idempotency.Guard[pgx.Tx], o *idemhttp.Options, h frameworktest.Handlers) string {
	return start(t, idemhttp.Middleware(g, o), h)
}

// start serves the suite's routes with chi: the middleware with r.Use on a
// group, chi's Recoverer outside it.
func start(t *testing.T, mw func(http.Handler) http.Handler, h frameworktest.Handlers) string {
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	r.Group(func(r chi.Router) {
		r.Use(mw)
		handle := func(path string, f func(w http.ResponseWriter, r *http.Request, n int64)) {
			r.Post(path, func(w http.ResponseWriter, r *http.Request) {
				n := h.Run()
				if err := h.Effect(r.Context()); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				f(w, r, n)
			})
		}
		handle(frameworktest.RouteWrite, func(w http.ResponseWriter, r *http.Request, n int64) {
			b, _ := json.Marshal(frameworktest.Body(n))
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "/things/"+strconv.FormatInt(n, 10))
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(b)
		})
		handle(frameworktest.RouteError, func(w http.ResponseWriter, r *http.Request, _ int64) {
			http.Error(w, "upstream failed", http.StatusBadGateway)
		})
		handle(frameworktest.RoutePanic, func(http.ResponseWriter, *http.Request, int64) { panic("handler bug") })
		handle(frameworktest.RouteNothing, func(http.ResponseWriter, *http.Request, int64) {})
		handle(frameworktest.RouteBind, func(w http.ResponseWriter, r *http.Request, _ int64) {
			var in struct {
				Amount int `json:"amount"`
			}
			if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})
	})
	srv := httptest.NewUnstartedServer(r)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestChi(t *testing.T) {
	t.Parallel()
	frameworktest.Run(t, mount{})
}
