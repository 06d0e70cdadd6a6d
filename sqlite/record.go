package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// read reads the key's row in tx: its record if it is completed, else an
// error wrapping [idempotency.ErrInProgress].
func (s *Store) read(ctx context.Context, tx *sql.Tx, key idempotency.Key) (*backend.Record, error) {
	var (
		fp, state        string
		status           int64
		header, body     []byte
		bodyNull         bool
		created, expires int64
	)
	err := tx.QueryRowContext(ctx, s.q.read, key.Scope, key.ID).
		Scan(&fp, &state, &status, &header, &body, &bodyNull, &created, &expires)
	if err != nil {
		return nil, mapError(ctx, "reserve: read live key", err)
	}
	if state != "completed" {
		// An unfinished operation (see Store.Acquire; its expiry is
		// MaxExpiry), or a pending row committed by a writer outside this
		// package: held either way, never taken over.
		return nil, fmt.Errorf("%w: sqlite: key %v has a committed pending row (an unfinished operation, or a reservation committed outside this package) until %v",
			idempotency.ErrInProgress, key, time.Unix(0, expires).UTC())
	}
	return record(key, fp, status, header, body, bodyNull, created, expires)
}

// record builds a Record from a row's columns: a NULL body is a nil Body,
// an empty BLOB an empty non-nil one.
func record(key idempotency.Key, fp string, status int64, header, body []byte, bodyNull bool, created, expires int64) (*backend.Record, error) {
	h, err := backend.UnmarshalHeader(header)
	if err != nil {
		return nil, fmt.Errorf("sqlite: key %v: stored header: %w", key, err)
	}
	if body == nil && !bodyNull {
		body = []byte{}
	}
	return &backend.Record{
		Key:         key,
		Fingerprint: fp,
		Status:      int(status),
		Header:      h,
		Body:        body,
		CreatedAt:   time.Unix(0, created).UTC(),
		ExpiresAt:   time.Unix(0, expires).UTC(),
	}, nil
}

// copyRecord returns a copy of rec that shares no header map nor body
// bytes with it (nil and empty kept apart).
func copyRecord(rec *backend.Record) *backend.Record {
	c := *rec
	c.Header = rec.Header.Clone()
	c.Body = bytes.Clone(rec.Body)
	return &c
}
