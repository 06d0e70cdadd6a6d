package idemgin_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/idemhttp/idemgin"
	"github.com/go-idempotency/idempotency/internal/frameworktest"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/observe"
)

// adapters are the ways people mount a net/http middleware on gin; each
// hands the middleware c.Writer and lets gin's handlers write to it.
var adapters = []struct {
	name string
	// aborts: the adapter calls c.Abort() when the middleware answered
	// without calling its handler; without it gin runs the next handler
	// itself afterwards (outside any transaction).
	aborts bool
	wrap   func(mw func(http.Handler) http.Handler) gin.HandlerFunc
}{
	{"usual", false, func(mw func(http.Handler) http.Handler) gin.HandlerFunc {
		// The usual adapter: c.Request = r; c.Next().
		return func(c *gin.Context) {
			h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c.Request = r
				c.Next()
			}))
			h.ServeHTTP(c.Writer, c.Request)
		}
	}},
	{"context", true, func(mw func(http.Handler) http.Handler) gin.HandlerFunc {
		// gwatts/gin-adapter's shape: the gin context travels in the
		// request's context, one next handler for every request, and
		// c.Abort() when the middleware did not call it.
		type state struct {
			c      *gin.Context
			called bool
		}
		type stateKey struct{}
		h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			st := r.Context().Value(stateKey{}).(*state)
			st.called = true
			st.c.Request = r
			st.c.Next()
		}))
		return func(c *gin.Context) {
			st := &state{c: c}
			h.ServeHTTP(c.Writer, c.Request.WithContext(context.WithValue(c.Request.Context(), stateKey{}, st)))
			if !st.called {
				c.Abort()
			}
		}
	}},
}

// approved is the body the handlers answer.
const approved = `{"status":"approved"}`

// styles are the ways a gin handler answers 201.
var styles = []struct {
	name string
	// pending: gin only records the status; it is sent after the chain.
	pending bool
	answer  func(c *gin.Context)
}{
	{"JSON", false, func(c *gin.Context) {
		c.Header("Location", "/payments/1")
		c.JSON(http.StatusCreated, gin.H{"status": "approved"})
	}},
	{"Data", false, func(c *gin.Context) {
		c.Header("Location", "/payments/1")
		c.Data(http.StatusCreated, "application/json; charset=utf-8", []byte(approved))
	}},
	{"Writer", false, func(c *gin.Context) {
		c.Writer.Header().Set("Location", "/payments/1")
		c.Writer.WriteHeader(http.StatusCreated)
		_, _ = c.Writer.WriteString(approved)
	}},
	{"StatusOnly", true, func(c *gin.Context) { c.Header("Location", "/payments/1"); c.Status(http.StatusCreated) }},
}

// collector gathers what the middleware reports.
type collector struct {
	mu     sync.Mutex
	errs   []error
	events []idemhttp.RequestEvent
}

func (cl *collector) options() *idemhttp.Options {
	return &idemhttp.Options{
		Scope:   idemhttp.SharedScope, // one test client
		OnError: func(_ *http.Request, err error) { cl.mu.Lock(); defer cl.mu.Unlock(); cl.errs = append(cl.errs, err) },
		Observer: func(_ context.Context, ev idemhttp.RequestEvent) {
			cl.mu.Lock()
			defer cl.mu.Unlock()
			cl.events = append(cl.events, ev)
		},
	}
}

func (cl *collector) get() ([]error, []idemhttp.RequestEvent) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return append([]error(nil), cl.errs...), append([]idemhttp.RequestEvent(nil), cl.events...)
}

// TestUsualAdapterBypass is the bypass failure: with the generic middleware mounted
// through a net/http adapter, a gin handler that inserts a payment through
// the transaction and answers 201 on c.Writer told the client "approved"
// while the middleware, seeing no answer, rolled the payment back; every
// retry did it again. The first request cannot be taken back when its 201
// went out (it is rolled back and reported once, naming idemgin); a 201
// gin still holds is replaced by 500. Every later request is refused with
// 500 before the handler runs inside a transaction, nothing is committed.
func TestUsualAdapterBypass(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.ReleaseMode)
	for _, ad := range adapters {
		for _, st := range styles {
			t.Run(ad.name+"/"+st.name, func(t *testing.T) {
				t.Parallel()
				e := frameworktest.SQLite(t)
				var cl collector
				var calls, inTx atomic.Int64
				r := gin.New()
				r.POST("/pay", ad.wrap(idemhttp.Middleware(e.Guard(t, nil), cl.options())), func(c *gin.Context) {
					calls.Add(1)
					if _, ok := idemgin.TxFrom[*sql.Tx](c); !ok {
						c.AbortWithStatus(http.StatusInternalServerError) // run by gin outside the middleware
						return
					}
					inTx.Add(1)
					if err := e.Handlers.Effect(c.Request.Context()); err != nil {
						c.AbortWithStatus(http.StatusInternalServerError)
						return
					}
					st.answer(c)
				})
				srv := httptest.NewServer(r)
				t.Cleanup(srv.Close)

				first := frameworktest.Post(t, srv.URL+"/pay", "u-1", `{"amount":1999}`)
				switch {
				case first.Err != nil:
					t.Fatal(first.Err)
				case st.pending:
					wantInternal(t, "first", first)
				case first.Status != http.StatusCreated || string(first.Body) != approved:
					t.Fatalf("first: %d %q; want the handler's 201 %s, which went out around the middleware", first.Status, first.Body, approved)
				}
				for i, key := range []string{"u-1", "u-1", "u-2"} {
					res := frameworktest.Post(t, srv.URL+"/pay", key, `{"amount":1999}`)
					if res.Status == http.StatusCreated {
						t.Fatalf("request %d (%s): 201 again (handler ran %d times in a transaction); want 500 before it runs", i+2, key, inTx.Load())
					}
					wantInternal(t, fmt.Sprintf("request %d", i+2), res)
				}
				if n := inTx.Load(); n != 1 {
					t.Errorf("handler ran %d times in a transaction, want 1", n)
				}
				if n, want := calls.Load(), map[bool]int64{true: 1, false: 4}[ad.aborts]; n != want {
					t.Errorf("handler called %d times, want %d", n, want)
				}
				for _, key := range []string{"u-1", "u-2"} {
					if n := e.Count(t, "", key); n != 0 {
						t.Errorf("%s: %d effects committed, want 0", key, n)
					}
				}
				errs, events := cl.get()
				if len(errs) != 1 || !errors.Is(errs[0], idemhttp.ErrWriterBypassed) || !strings.Contains(errs[0].Error(), "idemgin.Middleware") {
					t.Fatalf("OnError got %v; want one ErrWriterBypassed that names idemgin.Middleware", errs)
				}
				if len(events) != 4 {
					t.Fatalf("%d events, want 4: %+v", len(events), events)
				}
				wantStatus := map[bool]int{true: http.StatusInternalServerError, false: http.StatusCreated}[st.pending]
				if ev := events[0]; !errors.Is(ev.Err, idemhttp.ErrWriterBypassed) || ev.Outcome != observe.Internal || ev.Status != wantStatus {
					t.Errorf("first event %+v; want internal, ErrWriterBypassed, status %d", ev, wantStatus)
				}
				for _, ev := range events[1:] {
					if !errors.Is(ev.Err, idemhttp.ErrBypassRefused) || ev.Status != http.StatusInternalServerError {
						t.Errorf("event %+v; want ErrBypassRefused, 500", ev)
					}
				}
			})
		}
	}
}

// wantInternal checks a 500 ProblemInternal that carries none of the
// handler's header fields.
func wantInternal(t *testing.T, what string, res frameworktest.Result) {
	t.Helper()
	if res.Status != http.StatusInternalServerError || !strings.Contains(string(res.Body), "idemhttp#ProblemInternal") ||
		res.Header.Get("Content-Type") != "application/problem+json" || res.Header.Get("Location") != "" {
		t.Errorf("%s: %d %v %q; want 500 %s without the handler's Location", what, res.Status, res.Header, res.Body, "idemhttp#ProblemInternal")
	}
	if strings.Contains(string(res.Body), "approved") {
		t.Errorf("%s: %q; the handler's answer is in it", what, res.Body)
	}
}

// TestIdemginNoBypass: the same handlers mounted with idemgin.Middleware,
// several requests at once on a few keys, plus a handler that writes
// nothing: each key commits once and is replayed byte-exact, nothing is
// taken for a bypass, nothing is refused.
func TestIdemginNoBypass(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.ReleaseMode)
	for _, st := range styles {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			e := frameworktest.SQLite(t)
			var cl collector
			var runs atomic.Int64
			r := gin.New()
			r.POST("/pay", idemgin.Middleware(e.Guard(t, nil), cl.options()), func(c *gin.Context) {
				runs.Add(1)
				if err := e.Handlers.Effect(c.Request.Context()); err != nil {
					c.AbortWithStatus(http.StatusInternalServerError)
					return
				}
				if strings.HasPrefix(c.GetHeader(idemhttp.DefaultKeyHeader), "silent") {
					_ = c.Error(errors.New("recorded, never written"))
					return
				}
				st.answer(c)
			})
			srv := httptest.NewServer(r)
			t.Cleanup(srv.Close)

			const keys, perKey = 3, 4
			res := make([]frameworktest.Result, keys*perKey)
			testkit.Together(len(res), func(i int) { res[i] = frameworktest.Post(t, srv.URL+"/pay", fmt.Sprintf("k-%d", i%keys), `{}`) })
			for i, got := range res {
				first := res[i%keys]
				if got.Err != nil || got.Status != http.StatusCreated || !bytes.Equal(got.Body, first.Body) || got.Header.Get("Location") != "/payments/1" {
					t.Errorf("request %d: %d %v %q (%v); want 201 with Location and its key's first bytes %q", i, got.Status, got.Header, got.Body, got.Err, first.Body)
				}
				if !st.pending && string(got.Body) != approved {
					t.Errorf("request %d: body %q, want %s", i, got.Body, approved)
				}
			}
			for k := range keys {
				if n := e.Count(t, "", fmt.Sprintf("k-%d", k)); n != 1 {
					t.Errorf("k-%d: %d effects, want 1", k, n)
				}
			}
			for range 2 {
				if got := frameworktest.Post(t, srv.URL+"/pay", "silent-1", `{}`); got.Status != http.StatusInternalServerError ||
					!strings.Contains(string(got.Body), "idemhttp#ProblemNoResponse") {
					t.Errorf("silent: %d %q; want 500 %s", got.Status, got.Body, "idemhttp#ProblemNoResponse")
				}
			}
			if got := frameworktest.Post(t, srv.URL+"/pay", "k-new", `{}`); got.Status != http.StatusCreated {
				t.Errorf("a new key after the silent ones: %d %q; want 201", got.Status, got.Body)
			}
			if n := runs.Load(); n != keys+3 {
				t.Errorf("handler ran %d times, want %d", n, keys+3)
			}
			errs, events := cl.get()
			for _, err := range errs {
				if !errors.Is(err, idemhttp.ErrNoResponse) {
					t.Errorf("OnError got %v; want only ErrNoResponse", err)
				}
			}
			for _, ev := range events {
				if errors.Is(ev.Err, idemhttp.ErrWriterBypassed) || errors.Is(ev.Err, idemhttp.ErrBypassRefused) {
					t.Errorf("event %+v: a bypass where there is none", ev)
				}
			}
		})
	}
}

// split is c.Writer as mwblythe/midgin's adapter rebuilds it: Header,
// WriteHeader and Write go to the middleware's writer, gin's own methods
// (WriteHeaderNow, WriteString, Written...) to the original c.Writer.
type split struct {
	gin.ResponseWriter
	w http.ResponseWriter
}

func (s split) Header() http.Header         { return s.w.Header() }
func (s split) WriteHeader(code int)        { s.w.WriteHeader(code) }
func (s split) Write(p []byte) (int, error) { return s.w.Write(p) }

// TestSplitAdapter: an adapter that hands gin's handlers the middleware's
// writer for Write but gin's for WriteHeaderNow. c.JSON writes wholly
// through the middleware: stored, replayed, no bypass. c.AbortWithStatus
// sends gin's own status around it: the middleware still saw the 202, so
// the payment is committed and the 202 stored as usual (rolling it back
// after a 2xx went out would be the bypass failure again), the bypass is reported
// once, and new keys are refused before the handler runs.
func TestSplitAdapter(t *testing.T) {
	t.Parallel()
	gin.SetMode(gin.ReleaseMode)
	e := frameworktest.SQLite(t)
	var cl collector
	mw := idemhttp.Middleware(e.Guard(t, nil), cl.options())
	adapter := func(c *gin.Context) {
		called := false
		mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			called = true
			if _, ok := w.(gin.ResponseWriter); !ok {
				c.Writer = split{ResponseWriter: c.Writer, w: w}
			}
			c.Request = r
			c.Next()
		})).ServeHTTP(c.Writer, c.Request)
		if !called {
			c.Abort()
		}
	}
	var runs atomic.Int64
	handler := func(answer func(*gin.Context)) gin.HandlerFunc {
		return func(c *gin.Context) {
			runs.Add(1)
			if err := e.Handlers.Effect(c.Request.Context()); err != nil {
				c.AbortWithStatus(http.StatusInternalServerError)
				return
			}
			answer(c)
		}
	}
	r := gin.New()
	r.POST("/json", adapter, handler(func(c *gin.Context) { c.JSON(http.StatusCreated, gin.H{"status": "approved"}) }))
	r.POST("/abort", adapter, handler(func(c *gin.Context) { c.AbortWithStatus(http.StatusAccepted) }))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)

	first := frameworktest.Post(t, srv.URL+"/json", "j-1", `{}`)
	replay := frameworktest.Post(t, srv.URL+"/json", "j-1", `{}`)
	if first.Status != http.StatusCreated || string(first.Body) != approved || replay.Status != http.StatusCreated ||
		!bytes.Equal(replay.Body, first.Body) || replay.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("json: %d %q, then %d %q %v; want 201 %s, then its replay", first.Status, first.Body, replay.Status, replay.Body, replay.Header, approved)
	}
	if errs, _ := cl.get(); len(errs) != 0 {
		t.Fatalf("OnError got %v before any bypass", errs)
	}

	aborted := frameworktest.Post(t, srv.URL+"/abort", "a-1", `{}`)
	if aborted.Status != http.StatusOK {
		t.Errorf("abort: %d; want gin's own 200, sent around the middleware", aborted.Status)
	}
	if n := e.Count(t, "", "a-1"); n != 1 {
		t.Errorf("abort: %d effects, want 1: the middleware saw 202 and committed it", n)
	}
	if again := frameworktest.Post(t, srv.URL+"/abort", "a-1", `{}`); again.Status != http.StatusAccepted || again.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Errorf("abort again: %d %v; want the stored 202, replayed", again.Status, again.Header)
	}
	for _, route := range []string{"/abort", "/json"} {
		wantInternal(t, route+" new key", frameworktest.Post(t, srv.URL+route, "n"+route, `{}`))
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2 (j-1, a-1)", n)
	}
	errs, events := cl.get()
	if len(errs) != 1 || !errors.Is(errs[0], idemhttp.ErrWriterBypassed) {
		t.Fatalf("OnError got %v; want one ErrWriterBypassed", errs)
	}
	if ev := events[2]; ev.Outcome != observe.Executed || ev.Status != http.StatusOK || !errors.Is(ev.Err, idemhttp.ErrWriterBypassed) {
		t.Errorf("abort event %+v; want executed, status 200 (what the client got), ErrWriterBypassed", ev)
	}
}
