package idemgin_test

import (
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/idemhttp/idemgin"
	"github.com/go-idempotency/idempotency/internal/frameworktest"
)

type mount struct{}

func (mount) SQLite(t *testing.T, g *idempotency.Guard[*sql.Tx], o *idemhttp.Options, h frameworktest.Handlers) string {
	return start(t, idemgin.Middleware(g, o), h)
}

func (mount) Postgres(t *testing.T, g *idempotency.Guard[pgx.Tx], o *idemhttp.Options, h frameworktest.Handlers) string {
	return start(t, idemgin.Middleware(g, o), h)
}

// start serves the suite's routes with gin, mw on each route.
func start(t *testing.T, mw gin.HandlerFunc, h frameworktest.Handlers) string {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.CustomRecoveryWithWriter(nil, func(c *gin.Context, _ any) { c.AbortWithStatus(http.StatusInternalServerError) }))
	effect := func(c *gin.Context) int64 {
		n := h.Run()
		if err := h.Effect(c.Request.Context()); err != nil {
			c.AbortWithStatusJSON(http.StatusInternalServerError, gin.H{"error": err.Error()})
			return 0
		}
		return n
	}
	r.POST(frameworktest.RouteWrite, mw, func(c *gin.Context) {
		if n := effect(c); n > 0 {
			c.Header("Location", "/things/"+strconv.FormatInt(n, 10))
			c.JSON(http.StatusCreated, frameworktest.Body(n))
		}
	})
	r.POST(frameworktest.RouteError, mw, func(c *gin.Context) {
		if effect(c) > 0 {
			c.AbortWithStatusJSON(http.StatusBadGateway, gin.H{"error": "upstream failed"})
		}
	})
	r.POST(frameworktest.RoutePanic, mw, func(c *gin.Context) {
		effect(c)
		panic("handler bug")
	})
	r.POST(frameworktest.RouteNothing, mw, func(c *gin.Context) {
		effect(c)
		_ = c.Error(context.DeadlineExceeded) // recorded, never written
	})
	r.POST(frameworktest.RouteBind, mw, func(c *gin.Context) {
		if effect(c) == 0 {
			return
		}
		var in struct {
			Amount int `json:"amount"`
		}
		if err := c.ShouldBindJSON(&in); err != nil {
			c.AbortWithStatusJSON(http.StatusBadRequest, gin.H{"error": err.Error()})
			return
		}
		c.Status(http.StatusCreated)
	})
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestGin(t *testing.T) {
	t.Parallel()
	frameworktest.Run(t, mount{})
}

// TestStatusOnly: c.Status(204) with no body is an answer (gin sends it
// when the chain ends); it is stored and replayed.
func TestStatusOnly(t *testing.T) {
	t.Parallel()
	e := frameworktest.SQLite(t)
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.POST("/accept", idemgin.Middleware(e.Guard(t, nil), &idemhttp.Options{Scope: idemhttp.SharedScope}), func(c *gin.Context) {
		e.Handlers.Run()
		if err := e.Handlers.Effect(c.Request.Context()); err != nil {
			c.AbortWithStatus(http.StatusInternalServerError)
			return
		}
		c.Status(http.StatusNoContent)
	})
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	first := frameworktest.Post(t, srv.URL+"/accept", "s-1", `{}`)
	replay := frameworktest.Post(t, srv.URL+"/accept", "s-1", `{}`)
	if first.Status != http.StatusNoContent || replay.Status != http.StatusNoContent || replay.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("first %d, replay %d %v; want 204 then a replayed 204", first.Status, replay.Status, replay.Header)
	}
	if n := e.Count(t, "", "s-1"); n != 1 || e.Runs() != 1 {
		t.Errorf("%d effects, %d runs; want 1, 1", n, e.Runs())
	}
}
