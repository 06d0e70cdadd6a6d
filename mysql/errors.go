package mysql

import (
	"context"
	"errors"
	"fmt"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

var (
	// errDuplicate marks a duplicate-key error (1062) from mapError.
	errDuplicate = errors.New("mysql: duplicate key")
	// errPendingGone marks the SIGNAL of the folded completion (1644 with
	// the message pendingGone): the key's pending row was gone, nothing was
	// committed.
	errPendingGone = errors.New("mysql: the key's pending row is gone from the transaction")
)

// MySQL and MariaDB error numbers that mapError translates.
const (
	erDupEntry        = 1062 // ER_DUP_ENTRY
	erLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT; MariaDB's NOWAIT too
	erLockDeadlock    = 1213 // ER_LOCK_DEADLOCK
	erCheckRead       = 1020 // ER_CHECKREAD: MariaDB's innodb_snapshot_isolation
	erLockNowait      = 3572 // ER_LOCK_NOWAIT: MySQL's NOWAIT
	erSignal          = 1644 // ER_SIGNAL_EXCEPTION: a SIGNAL of the store's own
	erNoSuchTable     = 1146 // ER_NO_SUCH_TABLE (and erBadFieldName, 1054: an unknown column)
	erNoDB            = 1046 // ER_NO_DB_ERROR: a DSN that names no database
)

// pendingGone is the message of the SIGNAL with which the store's folded
// completion refuses to commit when the key's pending row is gone.
const pendingGone = "idempotency: the pending row is gone"

// isConflictCode reports whether a statement that failed with the driver
// error number n can succeed when its transaction is run again.
func isConflictCode(n uint16) bool {
	switch n {
	case erLockDeadlock, erLockWaitTimeout, erCheckRead, erLockNowait:
		return true
	}
	return false
}

// lockRefused reports whether err is a statement's refusal to wait for a
// lock, or its wait running out (1205, or 3572 for NOWAIT).
func lockRefused(err error) bool {
	var me *gomysql.MySQLError
	return errors.As(err, &me) && (me.Number == erLockWaitTimeout || me.Number == erLockNowait)
}

// IsConflict implements [backend.ConflictClassifier]. Errors it
// matches are a deadlock (1213), a lock wait timeout (1205, or 3572 for
// NOWAIT) and a snapshot conflict (1020). Met by one of fn's own
// statements, they make [idempotency.Guard.Do] roll back and run the
// attempt again.
func (s *Store) IsConflict(err error) bool {
	var me *gomysql.MySQLError
	return errors.As(err, &me) && isConflictCode(me.Number)
}

// mapError is the package's one translation of driver errors. It marks
// err by its error number:
//
//   - a duplicate key with errDuplicate;
//   - the folded completion's SIGNAL with errPendingGone;
//   - a deadlock or snapshot conflict with [backend.ErrConflict];
//   - a lock wait timeout (or a NOWAIT refusal) with
//     [idempotency.ErrInProgress] when waiting says that the statement
//     waited for a key under the reservation's wait bound (another caller
//     still holds the key), else with [backend.ErrConflict];
//   - a missing table (1146, or no database: 1046) or column (1054) with
//     [idempotency.ErrSchema]
//     and what to run: only the store's own statements come here, so the
//     table is the keys table or its quota table, which the server's
//     message names (a column's, the column).
//
// An error marked already is kept as it is. Once ctx is done it makes sure
// ctx.Err() is in the chain (the driver may report a cancelled statement as
// a broken connection). A non-empty format prefixes the message. A nil err
// stays nil.
func mapError(ctx context.Context, err error, waiting bool, format string, args ...any) error {
	if err == nil {
		return nil
	}
	var me *gomysql.MySQLError
	marked := errors.Is(err, errDuplicate) || errors.Is(err, errPendingGone) ||
		errors.Is(err, backend.ErrConflict) || errors.Is(err, idempotency.ErrInProgress) ||
		errors.Is(err, idempotency.ErrSchema)
	if !marked && errors.As(err, &me) {
		switch {
		case me.Number == erDupEntry:
			err = fmt.Errorf("%w: %w", errDuplicate, err)
		case me.Number == erSignal && me.Message == pendingGone:
			err = fmt.Errorf("%w: %w", errPendingGone, err)
		case waiting && (me.Number == erLockWaitTimeout || me.Number == erLockNowait):
			err = fmt.Errorf("%w: %w", idempotency.ErrInProgress, err)
		case isConflictCode(me.Number):
			err = fmt.Errorf("%w: %w", backend.ErrConflict, err)
		case me.Number == erNoSuchTable || me.Number == erNoDB:
			err = fmt.Errorf("%w: mysql: a table of the store does not exist in the DSN's database: %s: %w", idempotency.ErrSchema, migrateHint, err)
		case me.Number == erBadFieldName:
			err = fmt.Errorf("%w: mysql: the store's table lacks a column this version needs: %s: %w", idempotency.ErrSchema, migrateHint, err)
		}
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w (%w)", cerr, err)
	}
	if format == "" {
		return err
	}
	return fmt.Errorf(format+": %w", append(args, err)...)
}

// migrateHint says how to create or upgrade the store's tables.
const migrateHint = "run Store.Migrate, or apply mysql.Schema and mysql.QuotaSchema in your migrations (Guard.CheckSchema names what is missing)"
