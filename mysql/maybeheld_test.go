package mysql

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// TestMayBeHeld: a conflict of the first try (Wait == 0) of a caller that
// waits, its deadline ahead, is reported as ErrInProgress too (the conflict
// kept), so that the core makes its waiting try; every other error,
// and every error of a NoWait caller, a waiting try or a try past the
// deadline, is kept as it is.
func TestMayBeHeld(t *testing.T) {
	conflict := fmt.Errorf("mysql: reserve: %w: Error 1213", backend.ErrConflict)
	other := errors.New("mysql: broken connection")
	ahead := time.Now().Add(time.Minute)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name string
		ctx  context.Context
		r    backend.Reservation
		err  error
		held bool
	}{
		{"FirstTry", context.Background(), backend.Reservation{Deadline: ahead}, conflict, true},
		{"NoWait", context.Background(), backend.Reservation{NoWait: true, Deadline: ahead}, conflict, false},
		{"WaitingTry", context.Background(), backend.Reservation{Wait: time.Second, Deadline: ahead}, conflict, false},
		{"PastDeadline", context.Background(), backend.Reservation{Deadline: time.Now().Add(-time.Millisecond)}, conflict, false},
		{"NoDeadline", context.Background(), backend.Reservation{}, conflict, false},
		{"ContextDone", cancelled, backend.Reservation{Deadline: ahead}, conflict, false},
		{"OtherError", context.Background(), backend.Reservation{Deadline: ahead}, other, false},
		{"Nil", context.Background(), backend.Reservation{Deadline: ahead}, nil, false},
	} {
		got := mayBeHeld(c.ctx, c.r, c.err)
		switch {
		case c.held && (!errors.Is(got, idempotency.ErrInProgress) || !errors.Is(got, backend.ErrConflict)):
			t.Errorf("%s: %v; want ErrInProgress, ErrConflict kept", c.name, got)
		case !c.held && got != c.err:
			t.Errorf("%s: %v; want %v kept", c.name, got, c.err)
		}
	}
}
