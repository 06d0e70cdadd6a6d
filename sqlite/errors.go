package sqlite

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// The primary result codes (the low byte of an extended code) that a retry
// of the whole attempt can cure.
const (
	// codeBusy: another connection holds the lock the statement needs (the
	// write lock, or an exclusive lock during a checkpoint or recovery).
	codeBusy = sqlite3.SQLITE_BUSY
	// codeLocked: a lock of this connection's shared cache is taken.
	codeLocked = sqlite3.SQLITE_LOCKED
)

var (
	errClosed = errors.New("sqlite: store closed")
	errEnded  = errors.New("sqlite: reservation already completed or rolled back")
)

// isBusy reports whether err carries one of the retryable codes.
func isBusy(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff {
	case codeBusy, codeLocked:
		return true
	}
	return false
}

// noProgressColumn reports whether err is SQLite's refusal of a statement
// that names the progress column on a table without it (a v0.1.0 table).
func noProgressColumn(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_ERROR && strings.Contains(se.Error(), "no such column: progress")
}

// IsConflict implements [backend.ConflictClassifier]: err (from fn's
// own statements on the transaction) is SQLITE_BUSY or SQLITE_LOCKED, which
// a retry of the whole attempt can cure.
func (s *Store) IsConflict(err error) bool { return isBusy(err) }

// mapError is the one place that reads the driver's errors. Once ctx is
// done the error carries ctx.Err(). (database/sql may report a transaction
// it rolled back because ctx ended as sql.ErrTxDone alone.) Otherwise
// SQLITE_BUSY and SQLITE_LOCKED are retryable conflicts
// ([backend.ErrConflict]), a missing table or column of the store's
// statements is [idempotency.ErrSchema] with what to run, and every other
// error is returned as it is. Each gets op for context.
func mapError(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) {
			return fmt.Errorf("sqlite: %s: %w", op, err)
		}
		return fmt.Errorf("sqlite: %s: %w: %w", op, cerr, err)
	}
	if isBusy(err) {
		return fmt.Errorf("sqlite: %s: %w: %w", op, backend.ErrConflict, err)
	}
	if what := schemaMissing(err); what != "" {
		return fmt.Errorf("%w: sqlite: %s: %s: %s: %w", idempotency.ErrSchema, op, what, migrateHint, err)
	}
	return fmt.Errorf("sqlite: %s: %w", op, err)
}

// migrateHint says how to create or upgrade the store's tables.
const migrateHint = "run Store.Migrate, or apply sqlite.Schema and sqlite.QuotaSchema in your migrations (Guard.CheckSchema names what is missing)"

// schemaMissing says what SQLite's refusal err of a statement lacks: a
// table of the store (its message names it), a column, or "" when err is
// not such a refusal. Only the store's own statements reach mapError, so
// the table is the keys table or its quota table.
func schemaMissing(err error) string {
	var se *sqlite.Error
	if !errors.As(err, &se) || se.Code()&0xff != sqlite3.SQLITE_ERROR {
		return ""
	}
	msg := se.Error()
	switch {
	case strings.Contains(msg, "no such table: "):
		return "a table of the store does not exist in this database file"
	case strings.Contains(msg, "no such column: "), strings.Contains(msg, " has no column named "):
		return "the store's table lacks a column this version needs"
	}
	return ""
}
