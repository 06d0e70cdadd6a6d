package mysql

import (
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// key is a key with its scope and id as the []byte arguments the
// statements take (so that the driver sends them as binary strings).
type key struct {
	key       idempotency.Key
	scope, id []byte
}

func keyOf(k idempotency.Key) key {
	return key{key: k, scope: []byte(k.Scope), id: []byte(k.ID)}
}

// row is a key row as read from the table.
type row struct {
	found            bool
	fingerprint      []byte
	state            string
	status           int
	header, body     []byte
	created, expires int64
	// now is the clock the row is judged by: the server's when the
	// statement read it, or the test clock's (Config.Clock).
	now int64
}

// scanRow scans a row of the store's reads (cols). tnow, the test clock's
// reading (nil for the server's), replaces the server's clock the row
// came with.
func scanRow(sc interface{ Scan(...any) error }, tnow any) (row, error) {
	rw := row{found: true}
	err := sc.Scan(&rw.fingerprint, &rw.state, &rw.status, &rw.header, &rw.body, &rw.created, &rw.expires, &rw.now)
	if errors.Is(err, sql.ErrNoRows) {
		return row{}, nil
	}
	rw.judgeBy(tnow)
	return rw, err
}

// judgeBy makes the test clock's reading tnow, if not nil, the clock the
// row is judged by.
func (rw *row) judgeBy(tnow any) {
	if n, ok := tnow.(int64); ok {
		rw.now = n
	}
}

// live reports whether the row exists and has not expired by its clock.
func (rw row) live() bool { return rw.found && rw.expires > rw.now }

// completed reports whether the row is a completed record, live by its
// clock.
func (rw row) completed() bool { return rw.live() && rw.state == stateCompleted }

func (rw row) record(k idempotency.Key) (*backend.Record, error) {
	h, err := backend.UnmarshalHeader(rw.header)
	if err != nil {
		return nil, fmt.Errorf("mysql: key %v: stored header: %w", k, err)
	}
	return &backend.Record{
		Key:         k,
		Fingerprint: string(rw.fingerprint),
		Status:      rw.status,
		Header:      h,
		Body:        rw.body,
		CreatedAt:   time.Unix(0, rw.created).UTC(),
		ExpiresAt:   time.Unix(0, rw.expires).UTC(),
	}, nil
}

// nanos is t in Unix nanoseconds, clamped to int64 (years 1678 to 2262).
func nanos(t time.Time) int64 {
	switch {
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	case t.Before(time.Unix(0, math.MinInt64)):
		return math.MinInt64
	}
	return t.UnixNano()
}
