package idemfiber_test

import (
	"database/sql"
	"net"
	"net/http"
	"strconv"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/jackc/pgx/v5"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/idemhttp/idemfiber"
	"github.com/go-idempotency/idempotency/internal/frameworktest"
)

type mount struct{}

func (mount) SQLite(t *testing.T, g *idempotency.Guard[*sql.Tx], o *idemhttp.Options, h frameworktest.Handlers) string {
	return start(t, idemfiber.Middleware(g, o), h)
}

func (mount) Postgres(t *testing.T, g *idempotency.Guard[pgx.Tx], o *idemhttp.Options, h frameworktest.Handlers) string {
	return start(t, idemfiber.Middleware(g, o), h)
}

// serve runs app on a loopback listener until the test ends.
func serve(t *testing.T, app *fiber.App) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Listener(ln) }()
	t.Cleanup(func() {
		if err := app.Shutdown(); err != nil {
			t.Error(err)
		}
		<-done
	})
	return "http://" + ln.Addr().String()
}

// start serves the suite's routes with fiber, mw on each route.
func start(t *testing.T, mw fiber.Handler, h frameworktest.Handlers) string {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(recover.New())
	effect := func(c *fiber.Ctx) (int64, error) {
		n := h.Run()
		return n, h.Effect(c.UserContext())
	}
	app.Post(frameworktest.RouteWrite, mw, func(c *fiber.Ctx) error {
		n, err := effect(c)
		if err != nil {
			return err
		}
		c.Location("/things/" + strconv.FormatInt(n, 10))
		return c.Status(fiber.StatusCreated).JSON(frameworktest.Body(n))
	})
	app.Post(frameworktest.RouteError, mw, func(c *fiber.Ctx) error {
		if _, err := effect(c); err != nil {
			return err
		}
		return fiber.NewError(fiber.StatusBadGateway, "upstream failed")
	})
	app.Post(frameworktest.RoutePanic, mw, func(c *fiber.Ctx) error {
		_, _ = effect(c)
		panic("handler bug")
	})
	app.Post(frameworktest.RouteNothing, mw, func(c *fiber.Ctx) error {
		_, err := effect(c)
		return err
	})
	app.Post(frameworktest.RouteBind, mw, func(c *fiber.Ctx) error {
		if _, err := effect(c); err != nil {
			return err
		}
		var in struct {
			Amount int `json:"amount"`
		}
		if err := c.BodyParser(&in); err != nil {
			return fiber.NewError(fiber.StatusBadRequest, err.Error())
		}
		return c.SendStatus(fiber.StatusCreated)
	})
	return serve(t, app)
}

func TestFiber(t *testing.T) {
	t.Parallel()
	frameworktest.Run(t, mount{})
}

// TestAdaptorNotStored is the failure of the usual adapter: adaptor.HTTPMiddleware
// runs the handler after the middleware returned, so the middleware used
// to commit and store an empty 200 before the handler ran. Now it sees no
// answer: it rolls back and stores nothing, and the handler, run later
// outside any transaction, finds none.
func TestAdaptorNotStored(t *testing.T) {
	t.Parallel()
	env := frameworktest.SQLite(t)
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Post("/pay", adaptor.HTTPMiddleware(idemhttp.Middleware(env.Guard(t, nil), &idemhttp.Options{Scope: idemhttp.SharedScope})), func(c *fiber.Ctx) error {
		env.Handlers.Run()
		if err := env.Handlers.Effect(c.UserContext()); err != nil {
			return fiber.NewError(fiber.StatusInternalServerError, err.Error())
		}
		return c.SendStatus(fiber.StatusCreated)
	})
	url := serve(t, app)
	for i := 1; i <= 2; i++ {
		res := frameworktest.Post(t, url+"/pay", "adapt-1", `{}`)
		if res.Err != nil || res.Header.Get(idemhttp.HeaderReplayed) != "" || res.Status == http.StatusOK || res.Status == http.StatusCreated {
			t.Fatalf("attempt %d: %d %q %v (%v); want an error answer, never a stored one", i, res.Status, res.Body, res.Header, res.Err)
		}
	}
	if env.Runs() != 2 || env.Count(t, "", "adapt-1") != 0 {
		t.Errorf("%d runs, %d effects; want 2 runs and 0 effects", env.Runs(), env.Count(t, "", "adapt-1"))
	}
}
