package redis

import (
	"fmt"
	"strconv"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// cloneRecord returns a copy of rec that shares nothing with it.
func cloneRecord(rec *backend.Record) *backend.Record {
	c := *rec
	c.Header = rec.Header.Clone()
	c.Body = append([]byte{}, rec.Body...)
	return &c
}

// decodeRecord builds a Record from the fields the reservation script
// returns.
func decodeRecord(fp, status, hdr, body, created, expires, scope, id string) (*backend.Record, error) {
	st, err := strconv.Atoi(status)
	if err != nil {
		return nil, fmt.Errorf("bad status %q", status)
	}
	cr, err := strconv.ParseInt(created, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("bad created %q", created)
	}
	ex, err := strconv.ParseInt(expires, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("bad expires %q", expires)
	}
	h, err := backend.UnmarshalHeader([]byte(hdr))
	if err != nil {
		return nil, fmt.Errorf("bad header: %w", err)
	}
	return &backend.Record{
		Key:         idempotency.Key{Scope: scope, ID: id},
		Fingerprint: fp,
		Status:      st,
		Header:      h,
		Body:        []byte(body),
		CreatedAt:   time.UnixMilli(cr),
		ExpiresAt:   time.UnixMilli(ex),
	}, nil
}
