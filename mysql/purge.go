package mysql

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"

	gomysql "github.com/go-sql-driver/mysql"
)

// Purge implements [idempotency.KeyStore]. In one READ COMMITTED
// transaction it locks up to limit expired rows with FOR UPDATE SKIP
// LOCKED: rows held by open transactions are skipped, never waited for.
// Rows of unfinished operations (progress not NULL) never expire, and
// Purge skips them explicitly too. It
// deletes them by primary key, purgeChunk rows per statement, and commits.
// Expired means expires_at <= the server's clock (or the test clock,
// [Config.Clock]).
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, nil
	}
	b, err := s.testNow()
	if err != nil {
		return 0, err
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, mapError(ctx, err, false, "mysql: purge %s", s.table)
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	rows, err := tx.QueryContext(ctx, s.purgeSelect, b, limit)
	if me := (*gomysql.MySQLError)(nil); errors.As(err, &me) && me.Number == erBadFieldName {
		// A table of v0.1.0, not migrated yet: no progress column, and so no
		// unfinished operation to skip.
		rows, err = tx.QueryContext(ctx, s.purgeSelectV1, b, limit)
	}
	if err != nil {
		return 0, mapError(ctx, err, false, "mysql: purge %s", s.table)
	}
	var keys [][2][]byte
	for rows.Next() {
		var k [2][]byte
		if err := rows.Scan(&k[0], &k[1]); err != nil {
			_ = rows.Close()
			return 0, mapError(ctx, err, false, "mysql: purge %s", s.table)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return 0, mapError(ctx, err, false, "mysql: purge %s", s.table)
	}
	deleted := 0
	var q []byte
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), purgeChunk)]
		keys = keys[len(chunk):]
		q = s.appendPurgeDelete(q[:0], chunk)
		res, err := tx.ExecContext(ctx, string(q))
		if err != nil {
			return 0, mapError(ctx, err, false, "mysql: purge %s", s.table)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, mapError(ctx, err, false, "mysql: purge %s", s.table)
		}
		deleted += int(n)
	}
	if deleted == 0 {
		return 0, nil // nothing to commit: the deferred rollback ends tx
	}
	if err := tx.Commit(); err != nil {
		return 0, mapError(ctx, err, false, "mysql: purge %s: commit", s.table)
	}
	return deleted, nil
}

// purgeChunk is how many rows one DELETE of Purge names. Each row takes at
// most about 1 KiB of SQL (two hex-encoded keys of up to 255 bytes). So a
// statement stays far below max_allowed_packet (4 MiB at the least).
const purgeChunk = 250

// appendPurgeDelete appends to q a DELETE of exactly the rows keys (which
// the transaction has locked already), with the keys as hex literals. The
// keys form a derived table joined first (STRAIGHT_JOIN) to the keys table
// through its primary key (FORCE INDEX). Each row is found by one unique
// lookup, so the statement never reads, locks or waits for another row. (A
// WHERE naming the keys lets the optimizer scan a small table, or all the
// rows of one scope, and wait for rows that open transactions hold.)
func (s *Store) appendPurgeDelete(q []byte, keys [][2][]byte) []byte {
	q = append(q, "DELETE k FROM ("...)
	for i, k := range keys {
		if i == 0 {
			q = append(q, "SELECT "...)
		} else {
			q = append(q, " UNION ALL SELECT "...)
		}
		q = appendHex(q, k[0])
		if i == 0 {
			q = append(q, " AS scope"...)
		}
		q = append(q, ", "...)
		q = appendHex(q, k[1])
		if i == 0 {
			q = append(q, " AS id"...)
		}
	}
	q = append(q, ") AS d STRAIGHT_JOIN `"...)
	q = append(q, s.table...)
	return append(q, "` AS k FORCE INDEX (PRIMARY) ON k.scope = d.scope AND k.id = d.id"...)
}

// appendHex appends b as a hexadecimal literal, a binary string: X'...'.
func appendHex(q, b []byte) []byte {
	q = append(q, "X'"...)
	q = hex.AppendEncode(q, b)
	return append(q, '\'')
}
