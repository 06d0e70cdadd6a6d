package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// The store's own statements never depend on session state that a
// transaction pooler may not carry from one transaction to the next.
// Poolers are PgBouncer, PgCat and RDS Proxy in transaction mode. The pgx
// driver sends a batch in the connection's default exec mode. Its default,
// QueryExecModeCacheStatement, prepares named statements once per client
// connection. Behind a pooler, the next transaction may run on a server
// connection that does not have them, or that another client already
// prepared them on.
//
// So, until a connection is known to reach one server session (see
// noteBackend), sendBatch sends the store's batches as unnamed
// extended-protocol statements in one round trip. Their parameters' types are
// named and their values encoded here. A single statement goes through pgx
// with [pgx.QueryExecModeExec], or without arguments, which pgx sends with
// the simple protocol. On a
// connection known to be direct, pgx sends them in the pool's own mode,
// which saves the server parsing and planning them again.

// execMode is the pgx exec mode of the store's single statements on a
// connection not known to be direct.
const execMode = pgx.QueryExecModeExec

// backendKey is the key, in a connection's pgconn CustomData, of what the
// store learnt about it: backendDirect or backendPooled.
const backendKey = "github.com/go-idempotency/idempotency/postgres.backend"

const (
	backendDirect = 1 + iota
	backendPooled
)

// noteBackend records, once per connection, whether conn reaches its
// server session directly: whether pid, the process id the server reported
// in a transaction, is the one the connection's start-up gave. A pooler
// that shares server connections among clients answers their cancel
// requests itself and gives them an id of its own (PgBouncer does). So the
// two differ behind one. A TCP proxy, which keeps one client on one
// session, passes the server's through. The first judgement stands for
// the connection's life.
func noteBackend(conn *pgx.Conn, pid uint32) {
	data := conn.PgConn().CustomData()
	if _, ok := data[backendKey]; ok {
		return
	}
	if pid != 0 && pid == conn.PgConn().PID() {
		data[backendKey] = backendDirect
	} else {
		data[backendKey] = backendPooled
	}
}

// direct reports whether conn is known to reach one server session.
func direct(conn *pgx.Conn) bool {
	k, _ := conn.PgConn().CustomData()[backendKey].(int)
	return k == backendDirect
}

// storeResults are the results of send, read in order.
type storeResults interface {
	Exec() (pgconn.CommandTag, error)
	QueryRow() pgx.Row
	Close() error
	// Tx is the transaction the batch began (Batch.BeginTx with the
	// store's TxOptions), for a batch that began one and succeeded.
	Tx() pgx.Tx
}

// send sends b on conn in one round trip: through pgx on a connection
// known to be direct, else with sendBatch.
func (s *Store) send(ctx context.Context, conn *pgx.Conn, b *pgx.Batch) storeResults {
	if direct(conn) {
		return conn.SendBatch(ctx, b)
	}
	return s.sendBatch(ctx, conn, b)
}

// sendBatch sends b on conn in one round trip, as unnamed statements (see
// above), and returns its results, which the caller must Close before it uses conn again. The
// pool's tracer, if it traces batches, sees the batch as pgx would show it.
// If b begins a transaction (b.BeginTx with s's TxOptions), the results'
// Tx is that transaction.
func (s *Store) sendBatch(ctx context.Context, conn *pgx.Conn, b *pgx.Batch) *storeBatch {
	br := &storeBatch{ctx: ctx, conn: conn, b: b, opts: s.txOptions}
	if tr, ok := s.tracer.(pgx.BatchTracer); ok {
		br.tracer = tr
		br.ctx = tr.TraceBatchStart(ctx, conn, pgx.TraceBatchStartData{Batch: b})
	}
	pb := &pgconn.Batch{}
	m := conn.TypeMap()
	binary := []int16{pgtype.BinaryFormatCode} // every parameter and column
	for _, q := range b.QueuedQueries {
		values, oids, err := encodeParams(m, q.Arguments)
		if err != nil {
			br.err = fmt.Errorf("postgres: encode the parameters of %q: %w", q.SQL, err)
			br.closed = true
			br.trace(br.err)
			return br
		}
		pb.ExecParams(q.SQL, values, oids, binary, binary)
	}
	br.results, br.err = conn.PgConn().ExecBatch(ctx, pb).ReadAll()
	return br
}

// adoptTx returns the pgx transaction of conn for the transaction that a
// batch of sendBatch begins, without sending anything. It works because pgx
// hands out a transaction for a batch that begins one (Batch.BeginTx), and
// a batch with nothing queued is not sent.
func adoptTx(ctx context.Context, conn *pgx.Conn, opts pgx.TxOptions) pgx.Tx {
	b := &pgx.Batch{}
	b.BeginTx(opts)
	b.QueuedQueries = nil
	return conn.SendBatch(ctx, b).Tx()
}

// encodeParams encodes the arguments of one of the store's statements in
// the binary format, with the type each Go type stands for.
func encodeParams(m *pgtype.Map, args []any) ([][]byte, []uint32, error) {
	values := make([][]byte, len(args))
	oids := make([]uint32, len(args))
	for i, a := range args {
		var oid uint32
		switch a.(type) {
		case nil: // NULL, its type named by the statement's cast
			continue
		case time.Duration:
			oid = pgtype.IntervalOID
		case string:
			oid = pgtype.TextOID
		case int64, int:
			oid = pgtype.Int8OID
		case int32:
			oid = pgtype.Int4OID
		case time.Time:
			oid = pgtype.TimestamptzOID
		case []byte:
			oid = pgtype.ByteaOID
		case pgtype.TID:
			oid = pgtype.TIDOID
		default:
			return nil, nil, fmt.Errorf("argument %d: unexpected type %T", i+1, a)
		}
		// A non-nil buf: the encoding of "" is empty, not nil (NULL).
		v, err := m.Encode(oid, pgtype.BinaryFormatCode, a, []byte{})
		if err != nil {
			return nil, nil, fmt.Errorf("argument %d: %w", i+1, err)
		}
		values[i], oids[i] = v, oid
	}
	return values, oids, nil
}

// storeBatch is the results of sendBatch, read in order like pgx's.
type storeBatch struct {
	ctx     context.Context
	conn    *pgx.Conn
	b       *pgx.Batch
	tracer  pgx.BatchTracer
	opts    pgx.TxOptions
	results []*pgconn.Result
	err     error // the batch's first error
	next    int
	closed  bool
}

// Tx is the transaction the batch began, for a batch that began one and
// succeeded.
func (br *storeBatch) Tx() pgx.Tx { return adoptTx(br.ctx, br.conn, br.opts) }

// result returns the next result, or the error that stopped the batch
// before it.
func (br *storeBatch) result() (*pgconn.Result, error) {
	i := br.next
	br.next++
	if i < len(br.results) {
		r := br.results[i]
		if br.tracer != nil && i < len(br.b.QueuedQueries) {
			q := br.b.QueuedQueries[i]
			br.tracer.TraceBatchQuery(br.ctx, br.conn, pgx.TraceBatchQueryData{SQL: q.SQL, Args: q.Arguments, CommandTag: r.CommandTag, Err: r.Err})
		}
		return r, r.Err
	}
	if br.err != nil {
		return nil, br.err
	}
	return nil, errors.New("postgres: no more results in batch")
}

// Exec returns the next result's command tag.
func (br *storeBatch) Exec() (pgconn.CommandTag, error) {
	r, err := br.result()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return r.CommandTag, nil
}

// QueryRow returns the next result's first row.
func (br *storeBatch) QueryRow() pgx.Row {
	r, err := br.result()
	return resultRow{m: br.conn.TypeMap(), r: r, err: err}
}

// Close ends the batch: its error is the batch's first one.
func (br *storeBatch) Close() error {
	if br.closed {
		return br.err
	}
	br.closed = true
	if br.err == nil {
		for _, r := range br.results {
			if r.Err != nil {
				br.err = r.Err
				break
			}
		}
	}
	br.trace(br.err)
	return br.err
}

func (br *storeBatch) trace(err error) {
	if br.tracer != nil {
		br.tracer.TraceBatchEnd(br.ctx, br.conn, pgx.TraceBatchEndData{Err: err})
	}
}

// resultRow is the first row of one result of sendBatch.
type resultRow struct {
	m   *pgtype.Map
	r   *pgconn.Result
	err error
}

// Scan decodes the row's columns into dest (a nil dest skips its column),
// or returns [pgx.ErrNoRows].
func (row resultRow) Scan(dest ...any) error {
	switch {
	case row.err != nil:
		return row.err
	case len(row.r.Rows) == 0:
		return pgx.ErrNoRows
	}
	values := row.r.Rows[0]
	if len(dest) != len(values) {
		return fmt.Errorf("postgres: %d columns, %d destinations", len(values), len(dest))
	}
	for i, d := range dest {
		if d == nil {
			continue
		}
		fd := row.r.FieldDescriptions[i]
		if err := row.m.Scan(fd.DataTypeOID, fd.Format, values[i], d); err != nil {
			return fmt.Errorf("postgres: column %s: %w", fd.Name, err)
		}
	}
	return nil
}
