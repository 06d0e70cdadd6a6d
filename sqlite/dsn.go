package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/go-idempotency/idempotency"
)

// DSNOptions are the DSN query parameters [Open] uses, for callers who open
// the database themselves with sql.Open("sqlite", path+"?"+DSNOptions):
//
//   - journal_mode(WAL): readers never block the writer nor each other, so
//     replays and lookups run while a key is held;
//   - busy_timeout(5000): statements of other writers wait up to 5s for
//     the write lock instead of failing at once with SQLITE_BUSY;
//   - foreign_keys(1): foreign keys are enforced;
//   - _txlock=immediate: every transaction takes the write lock at BEGIN,
//     so a transaction that reads before it writes cannot fail with
//     SQLITE_BUSY when it upgrades its lock.
//
// The synchronous pragma is left at SQLite's default, FULL. Every COMMIT
// waits for an fsync of the WAL. So a key that Do has answered survives a
// power loss or an OS crash. Appending "&_pragma=synchronous(NORMAL)" makes
// a commit cheaper (no fsync until a checkpoint), but the last commits
// before a power loss can be rolled back. The key and its effect are lost
// together, so the database holds no duplicate. But the caller most likely
// never got the response, so it retries and fn runs again. Whatever fn did
// outside the database (a call to a payment provider) is then done twice. A
// crash of the process alone loses nothing in either mode.
const DSNOptions = "_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_txlock=immediate"

// Open opens the SQLite database file at path, creating it if needed, with
// [DSNOptions], and checks that it can be used. path is a plain file path.
// These are refused with an error wrapping [idempotency.ErrInvalidConfig]:
// "", ":memory:" (each connection would see its own database), a "file:"
// URI and a path containing '?'. The caller closes the returned *sql.DB.
func Open(ctx context.Context, path string) (*sql.DB, error) {
	switch {
	case path == "", path == ":memory:", strings.HasPrefix(path, "file:"), strings.Contains(path, "?"):
		return nil, fmt.Errorf("%w: sqlite: path %q: want a plain file path, not empty, \":memory:\", a file: URI or containing '?'",
			idempotency.ErrInvalidConfig, path)
	}
	db, err := sql.Open("sqlite", path+"?"+DSNOptions)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	// The first connection switches a fresh file to WAL, which takes
	// SQLite's exclusive lock. A process doing the same at the same
	// instant makes it fail with SQLITE_BUSY without waiting. (The busy
	// handler is not called where waiting could deadlock.)
	if err := retryBusy(ctx, func() error { return db.PingContext(ctx) }); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	return db, nil
}

// startWait bounds how long [Open] and [Store.Migrate] retry SQLITE_BUSY
// (processes opening and migrating one file at the same instant), besides
// ctx.
const startWait = 30 * time.Second

// retryBusy runs f until it returns anything but SQLITE_BUSY or
// SQLITE_LOCKED, sleeping a few random milliseconds between tries, while
// ctx lives and for at most startWait.
func retryBusy(ctx context.Context, f func() error) error {
	return retryBusyFor(ctx, startWait, f)
}

// retryBusyFor is retryBusy for at most bound.
func retryBusyFor(ctx context.Context, bound time.Duration, f func() error) error {
	start := time.Now()
	for {
		err := f()
		if err == nil || !isBusy(err) || ctx.Err() != nil || time.Since(start) > bound {
			return err
		}
		t := time.NewTimer(time.Millisecond + rand.N(10*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (while retrying: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}
