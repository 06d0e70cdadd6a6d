package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// ErrStatementCacheBehindPooler is in the chain of the error of a statement
// of fn that failed because pgx's statement cache prepared it on another
// server connection. That cache is the pool's default
// ([pgx.QueryExecModeCacheStatement]). Behind a transaction pooler
// (PgBouncer, PgCat, RDS Proxy in transaction mode) each transaction may
// run on another server connection.
//
// The server's error (SQLSTATE 26000 or 42P05) stays in the chain. The
// transaction was rolled back, so retrying with the same key is safe. But
// the pool needs default_query_exec_mode=exec (or cache_describe) in its
// DSN, or PgBouncer 1.21 or later with max_prepared_statements set.
var ErrStatementCacheBehindPooler = errors.New("postgres: a statement of fn lost the prepared statement pgx's cache made for it on another server connection (behind a transaction pooler?): " +
	"add default_query_exec_mode=exec (or cache_describe) to the pool's DSN, or set max_prepared_statements in PgBouncer 1.21 or later")

// SQLSTATE codes the store maps to the root sentinels.
const (
	codeInvalidStatementName = "26000" // invalid_sql_statement_name: no such prepared statement
	codeDuplicateStatement   = "42P05" // duplicate_prepared_statement
	codeUniqueViolation      = "23505" // unique_violation
	codeUndefinedColumn      = "42703" // undefined_column
	codeUndefinedTable       = "42P01" // undefined_table
	codeSerializationFailure = "40001" // serialization_failure
	codeDeadlockDetected     = "40P01" // deadlock_detected
	codeLockNotAvailable     = "55P03" // lock_not_available: lock_timeout
	codeQueryCanceled        = "57014" // query_canceled: statement_timeout, a cancel request
)

// IsConflict implements [backend.ConflictClassifier]: a serialization
// failure (40001) or a deadlock (40P01) met by one of fn's own statements
// makes [idempotency.Guard.Do] roll back and run the attempt again.
func (s *Store) IsConflict(err error) bool {
	pgErr, ok := serverError(err)
	return ok && (pgErr.Code == codeSerializationFailure || pgErr.Code == codeDeadlockDetected)
}

// poolerHint adds [ErrStatementCacheBehindPooler] to the chain of err if it
// says a statement of pgx's cache (named stmtcache_...) is missing or
// already there.
func poolerHint(err error) error {
	if pgErr, ok := serverError(err); ok && (pgErr.Code == codeInvalidStatementName || pgErr.Code == codeDuplicateStatement) &&
		strings.Contains(pgErr.Message, `"stmtcache_`) && !errors.Is(err, ErrStatementCacheBehindPooler) {
		return fmt.Errorf("%w: %w", ErrStatementCacheBehindPooler, err)
	}
	return err
}

// mapError maps an error of one of the store's own statements to the root
// sentinels. Once ctx is done, ctx.Err() is in the chain and nothing else is
// added. Serialization failures, deadlocks and a unique violation on the
// keys table (a key completed by another caller) wrap
// [backend.ErrConflict]. A statement cut by the server's lock_timeout or
// statement_timeout wraps [idempotency.ErrInProgress] when it was waiting
// for a key another caller holds (waitingForKey), [backend.ErrConflict]
// otherwise. The store's table or quota table missing (undefined_table) or
// lacking a column (undefined_column) wraps [idempotency.ErrSchema]. Anything
// else (a cut connection included) is returned as it is, and the core adds
// [idempotency.ErrStore].
func (s *Store) mapError(ctx context.Context, err error, waitingForKey bool) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) {
			return err
		}
		return fmt.Errorf("%w (%w)", cerr, err)
	}
	pgErr, ok := serverError(err)
	if !ok {
		return err
	}
	switch pgErr.Code {
	case codeSerializationFailure, codeDeadlockDetected:
		return fmt.Errorf("%w: %w", backend.ErrConflict, err)
	case codeLockNotAvailable, codeQueryCanceled:
		if waitingForKey {
			return fmt.Errorf("%w: %w", idempotency.ErrInProgress, err)
		}
		return fmt.Errorf("%w: %w", backend.ErrConflict, err)
	case codeUniqueViolation:
		if pgErr.TableName == s.tableName && (pgErr.SchemaName == s.schemaName || s.schemaName == "") {
			return fmt.Errorf("%w: %w", backend.ErrConflict, err)
		}
	case codeUndefinedTable, codeUndefinedColumn:
		return s.schemaError(pgErr, err)
	}
	return err
}

// schemaError wraps err, the server's undefined_table or undefined_column,
// with [idempotency.ErrSchema], naming the table (the keys table, or its
// quota table when the server's message names that) and what to run. An
// undefined_table that names neither is not the store's: it is returned
// as it is.
func (s *Store) schemaError(pgErr *pgconn.PgError, err error) error {
	quota := quotaName(s.tableName)
	table, ddl := s.table, "Schema"
	// The server names a relation as the statement wrote it: "name" or
	// "schema.name".
	if strings.Contains(pgErr.Message, quota+`"`) {
		table, ddl = strings.ReplaceAll(quotaTable(s.table), `"`, ""), "QuotaSchema"
	} else if pgErr.Code == codeUndefinedTable && !strings.Contains(pgErr.Message, s.tableName+`"`) {
		return err
	}
	what := "does not exist (in the connection's search_path)"
	if pgErr.Code == codeUndefinedColumn {
		what = "lacks a column this version needs"
	}
	return fmt.Errorf("%w: postgres: table %s %s: %s: %w", idempotency.ErrSchema, table, what, migrateHint(s.table, ddl), err)
}

// isUndefinedColumn reports whether err is the server's undefined_column: a
// statement that needs the columns of multi-step operations met a table of
// v0.1.0 that was not migrated.
func isUndefinedColumn(err error) bool {
	pgErr, ok := serverError(err)
	return ok && pgErr.Code == codeUndefinedColumn
}

// pqError is what lib/pq's *pq.Error offers, named here so that the core
// module does not depend on lib/pq: the error's fields by their protocol
// codes ('C' the SQLSTATE, 'M' the message, 's' the schema, 't' the
// table).
type pqError interface {
	error
	Get(k byte) string
}

// serverError returns the server's error in err's chain, from pgx (its own
// front end and its stdlib driver) or from lib/pq, as a *pgconn.PgError
// with the fields the store reads. It is the one place where the store
// learns a SQLSTATE: every mapping in this file goes through it.
func serverError(err error) (*pgconn.PgError, bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr, true
	}
	var pq pqError
	if errors.As(err, &pq) && pq.Get('C') != "" {
		return &pgconn.PgError{Code: pq.Get('C'), Message: pq.Get('M'), SchemaName: pq.Get('s'), TableName: pq.Get('t')}, true
	}
	return nil, false
}

// codeInFailedTransaction is in_failed_sql_transaction: a statement sent in
// a transaction that an earlier statement aborted.
const codeInFailedTransaction = "25P02"

// finishError maps an error of the batch that ends a reservation or phase
// (the key's row and COMMIT). The pgx front end learns before sending it
// whether fn aborted or ended the transaction (see link.ending); the
// database/sql one learns it from this error: the server's
// in_failed_sql_transaction, or [sql.ErrTxDone] for a transaction fn
// committed or rolled back through its *sql.Tx.
func (s *Store) finishError(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		if pgErr, ok := serverError(err); ok && pgErr.Code == codeInFailedTransaction {
			return fmt.Errorf("a statement of fn failed, the transaction is aborted: %w (%w)", pgx.ErrTxCommitRollback, err)
		}
		if errors.Is(err, sql.ErrTxDone) {
			return fmt.Errorf("the transaction was ended inside fn: %w (%w)", pgx.ErrTxClosed, err)
		}
	}
	return s.mapError(ctx, err, false)
}
