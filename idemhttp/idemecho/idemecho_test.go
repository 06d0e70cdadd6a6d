package idemecho_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/idemhttp/idemecho"
	"github.com/go-idempotency/idempotency/internal/frameworktest"
)

type mount struct{}

func (mount) SQLite(t *testing.T, g *idempotency.Guard[*sql.Tx], o *idemhttp.Options, h frameworktest.Handlers) string {
	return start(t, idemecho.Middleware(g, o), h)
}

func (mount) Postgres(t *testing.T, g *idempotency.Guard[pgx.Tx], o *idemhttp.Options, h frameworktest.Handlers) string {
	return start(t, idemecho.Middleware(g, o), h)
}

// start serves the suite's routes with echo, mw on each route.
func start(t *testing.T, mw echo.MiddlewareFunc, h frameworktest.Handlers) string {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{DisablePrintStack: true, DisableErrorHandler: false}))
	effect := func(c echo.Context) (int64, error) {
		n := h.Run()
		return n, h.Effect(c.Request().Context())
	}
	e.POST(frameworktest.RouteWrite, func(c echo.Context) error {
		n, err := effect(c)
		if err != nil {
			return err
		}
		c.Response().Header().Set("Location", "/things/"+strconv.FormatInt(n, 10))
		return c.JSON(http.StatusCreated, frameworktest.Body(n))
	}, mw)
	e.POST(frameworktest.RouteError, func(c echo.Context) error {
		if _, err := effect(c); err != nil {
			return err
		}
		return echo.NewHTTPError(http.StatusBadGateway, "upstream failed")
	}, mw)
	e.POST(frameworktest.RoutePanic, func(c echo.Context) error {
		_, _ = effect(c)
		panic("handler bug")
	}, mw)
	e.POST(frameworktest.RouteNothing, func(c echo.Context) error {
		_, err := effect(c)
		return err
	}, mw)
	e.POST(frameworktest.RouteBind, func(c echo.Context) error {
		if _, err := effect(c); err != nil {
			return err
		}
		var in struct {
			Amount int `json:"amount"`
		}
		if err := c.Bind(&in); err != nil {
			return err // echo's 400
		}
		return c.NoContent(http.StatusCreated)
	}, mw)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestEcho(t *testing.T) {
	t.Parallel()
	frameworktest.Run(t, mount{})
}

// TestWrapMiddlewareNotStored is the failure of the usual adapter: through
// echo.WrapMiddleware, a handler that inserts and returns
// echo.NewHTTPError(502) used to give an empty 200, a committed row and a
// stored key. Now the middleware sees no answer: it rolls back, stores
// nothing and answers 500.
func TestWrapMiddlewareNotStored(t *testing.T) {
	t.Parallel()
	env := frameworktest.SQLite(t)
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.POST("/pay", func(c echo.Context) error {
		env.Handlers.Run()
		if err := env.Handlers.Effect(c.Request().Context()); err != nil {
			return err
		}
		return echo.NewHTTPError(http.StatusBadGateway, "upstream failed")
	}, echo.WrapMiddleware(idemhttp.Middleware(env.Guard(t, nil), &idemhttp.Options{Scope: idemhttp.SharedScope})))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	for i := 1; i <= 2; i++ {
		res := frameworktest.Post(t, srv.URL+"/pay", "wrap-1", `{}`)
		if res.Status != http.StatusInternalServerError || res.Header.Get(idemhttp.HeaderReplayed) != "" {
			t.Fatalf("attempt %d: %d %q %v; want 500, never a stored answer", i, res.Status, res.Body, res.Header)
		}
	}
	if env.Runs() != 2 || env.Count(t, "", "wrap-1") != 0 {
		t.Errorf("%d runs, %d effects; want 2 runs (nothing stored) and 0 effects (rolled back)", env.Runs(), env.Count(t, "", "wrap-1"))
	}
}

// TestWrapMiddlewareWritesThrough: echo.WrapMiddleware hands the handler
// an echo response over the middleware's writer, so a c.JSON(201) is
// stored and replayed; it is not taken for a bypass. Only a returned error
// (written by echo after the middleware, TestWrapMiddlewareNotStored) is
// lost.
func TestWrapMiddlewareWritesThrough(t *testing.T) {
	t.Parallel()
	env := frameworktest.SQLite(t)
	var bypass atomic.Int64
	opts := &idemhttp.Options{Scope: idemhttp.SharedScope, Observer: func(_ context.Context, ev idemhttp.RequestEvent) {
		if errors.Is(ev.Err, idemhttp.ErrWriterBypassed) || errors.Is(ev.Err, idemhttp.ErrBypassRefused) {
			bypass.Add(1)
		}
	}}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.POST("/pay", func(c echo.Context) error {
		env.Handlers.Run()
		if err := env.Handlers.Effect(c.Request().Context()); err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, map[string]string{"status": "approved"})
	}, echo.WrapMiddleware(idemhttp.Middleware(env.Guard(t, nil), opts)))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	for _, key := range []string{"w-1", "w-2"} {
		first := frameworktest.Post(t, srv.URL+"/pay", key, `{}`)
		replay := frameworktest.Post(t, srv.URL+"/pay", key, `{}`)
		if first.Status != http.StatusCreated || replay.Status != http.StatusCreated || !bytes.Equal(first.Body, replay.Body) ||
			replay.Header.Get(idemhttp.HeaderReplayed) != "true" {
			t.Fatalf("%s: %d %q, then %d %q; want 201, then its replay", key, first.Status, first.Body, replay.Status, replay.Body)
		}
		if n := env.Count(t, "", key); n != 1 {
			t.Errorf("%s: %d effects, want 1", key, n)
		}
	}
	if env.Runs() != 2 || bypass.Load() != 0 {
		t.Errorf("%d runs, %d bypass events; want 2 runs, none", env.Runs(), bypass.Load())
	}
}

// TestHandRolledAdapterBypass: an echo adapter written like gin's usual
// one (c.SetRequest, but c.Response() left on echo's writer) lets the
// handler write around the middleware: the client got 201 while the
// payment was rolled back, on every retry. The middleware notices (echo's
// writer ran its Before hooks while the handler ran), writes nothing after
// the 201 that went out, reports it once naming idemecho, and refuses
// every later request with 500 before the handler runs.
func TestHandRolledAdapterBypass(t *testing.T) {
	t.Parallel()
	answers := map[string]struct {
		answer func(echo.Context) error
		body   string
	}{
		"JSON":      {func(c echo.Context) error { return c.JSON(http.StatusCreated, map[string]string{"status": "approved"}) }, `{"status":"approved"}` + "\n"},
		"NoContent": {func(c echo.Context) error { return c.NoContent(http.StatusCreated) }, ""}, // no header field changes
	}
	for name, a := range answers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := frameworktest.SQLite(t)
			var reports []error
			var mu sync.Mutex
			mw := idemhttp.Middleware(env.Guard(t, nil), &idemhttp.Options{Scope: idemhttp.SharedScope, OnError: func(_ *http.Request, err error) {
				mu.Lock()
				defer mu.Unlock()
				reports = append(reports, err)
			}})
			adapter := func(next echo.HandlerFunc) echo.HandlerFunc {
				return func(c echo.Context) (err error) {
					mw(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
						c.SetRequest(r)
						err = next(c)
					})).ServeHTTP(c.Response(), c.Request())
					return err
				}
			}
			e := echo.New()
			e.HideBanner, e.HidePort = true, true
			e.POST("/pay", func(c echo.Context) error {
				env.Handlers.Run()
				if err := env.Handlers.Effect(c.Request().Context()); err != nil {
					return err
				}
				return a.answer(c)
			}, adapter)
			srv := httptest.NewServer(e)
			t.Cleanup(srv.Close)
			first := frameworktest.Post(t, srv.URL+"/pay", "h-1", `{}`)
			if first.Status != http.StatusCreated || string(first.Body) != a.body {
				t.Fatalf("first: %d %q; want the 201 %q that went out around the middleware, and nothing after it", first.Status, first.Body, a.body)
			}
			for _, key := range []string{"h-1", "h-2"} {
				res := frameworktest.Post(t, srv.URL+"/pay", key, `{}`)
				if res.Status != http.StatusInternalServerError || !strings.Contains(string(res.Body), "idemhttp#ProblemInternal") {
					t.Errorf("%s: %d %q; want 500 %s", key, res.Status, res.Body, "idemhttp#ProblemInternal")
				}
				if n := env.Count(t, "", key); n != 0 {
					t.Errorf("%s: %d effects, want 0", key, n)
				}
			}
			if env.Runs() != 1 {
				t.Errorf("handler ran %d times, want 1", env.Runs())
			}
			mu.Lock()
			defer mu.Unlock()
			if len(reports) != 1 || !errors.Is(reports[0], idemhttp.ErrWriterBypassed) || !strings.Contains(reports[0].Error(), "idemecho.Middleware") {
				t.Errorf("OnError got %v; want one ErrWriterBypassed naming idemecho.Middleware", reports)
			}
		})
	}
}
