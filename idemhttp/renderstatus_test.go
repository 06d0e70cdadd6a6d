package idemhttp_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/go-idempotency/idempotency/idemhttp"
	"github.com/go-idempotency/idempotency/observe"
)

// testRenderProblemStatus: Event.Status is the status the client got, also
// when RenderProblem answers another one than the problem's; a renderer that
// writes nothing does not let an empty 200 out.
func testRenderProblemStatus[Tx any](t *testing.T, e env[Tx]) {
	rc := &recorded{}
	s := startServer(t, e, nil, &idemhttp.Options{
		Observer: rc.observe,
		RenderProblem: func(w http.ResponseWriter, r *http.Request, p *idemhttp.Problem) {
			if r.URL.Path == "/silent" {
				return // forgets to write
			}
			st := p.Status
			if st == http.StatusUnprocessableEntity {
				st = http.StatusConflict // this API's clients expect 409 for a reused key
			}
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(st)
			_, _ = io.WriteString(w, p.Title)
		},
	}, created)
	wantStatus(t, s.post(t, `{"a":1}`, "rp"), http.StatusCreated)
	res := s.post(t, `{"a":2}`, "rp") // same key, other body: a 422 problem
	if res.status != http.StatusConflict {
		t.Fatalf("the renderer's answer: %d %q, want 409", res.status, res.body)
	}
	if ev := rc.last(t); ev.Outcome != observe.Mismatch || ev.Status != http.StatusConflict {
		t.Errorf("event %+v; want mismatch with Status 409, the status sent", ev)
	}
	// A missing key (400) through a renderer that writes nothing: the
	// client gets the 400 problem, and the event says 400.
	res = s.send(t, http.MethodPost, "/silent", "application/json", `{}`)
	wantProblem(t, res, http.StatusBadRequest, idemhttp.ProblemMissingKey)
	if ev := rc.last(t); ev.Outcome != observe.Rejected || ev.Status != http.StatusBadRequest {
		t.Errorf("event %+v; want rejected with Status 400", ev)
	}
	s.wantCalls(t, 1)
}
