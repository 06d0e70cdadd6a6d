package testkit

import (
	"context"
	"database/sql"
	"fmt"
)

// Effects is a table of effects on a database/sql database whose driver
// takes ? placeholders (SQLite, MySQL). fn writes one row per effect,
// tagged, in its transaction. A test counts the rows of a tag to see how
// many times an effect was committed. Its methods have the shapes of
// conformance.Fixture's Effect, Count and Bare.
type Effects struct {
	// DB is the database the table is in.
	DB *sql.DB
	// Table is the table's name as it stands in SQL, quoted if it must be.
	Table string
	// Binary binds tags as []byte instead of string, for a binary column
	// that compares them byte for byte (MySQL's VARBINARY).
	Binary bool
}

// Create creates the table with one column, tag, of type tagType.
func (e Effects) Create(ctx context.Context, tagType string) error {
	if _, err := e.DB.ExecContext(ctx, "CREATE TABLE "+e.Table+" (tag "+tagType+")"); err != nil {
		return fmt.Errorf("create effects table %s: %w", e.Table, err)
	}
	return nil
}

func (e Effects) arg(tag string) any {
	if e.Binary {
		return []byte(tag)
	}
	return tag
}

// Effect writes one effect tagged tag in tx.
func (e Effects) Effect(ctx context.Context, tx *sql.Tx, tag string) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO "+e.Table+" (tag) VALUES (?)", e.arg(tag))
	return err
}

// Count returns the number of committed effects tagged tag.
func (e Effects) Count(ctx context.Context, tag string) (int, error) {
	var n int
	err := e.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+e.Table+" WHERE tag = ?", e.arg(tag)).Scan(&n)
	return n, err
}

// Bare writes the effect of Effect in a plain transaction of DB, with no
// idempotency: the baseline of the benchmarks.
func (e Effects) Bare(ctx context.Context, tag string) error {
	tx, err := e.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := e.Effect(ctx, tx, tag); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}
