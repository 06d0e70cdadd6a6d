package idemecho_test

import (
	"database/sql"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/idemhttp/idemecho"
	"github.com/go-idempotency/idempotency/idemhttp/internal/frameworktest"
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

// TestWrapMiddlewareNotStored is the failure of the issue: through
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
	}, echo.WrapMiddleware(idemhttp.Middleware(env.Guard(t, nil), nil)))
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
