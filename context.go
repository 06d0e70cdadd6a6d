package idempotency

import (
	"context"
	"fmt"
	"reflect"
)

type txContextKey struct{}

type keyContextKey struct{}

// txValue is what [WithTx] puts in a context: the transaction and its type
// as the integration knows it (the Guard's Tx), to name it when [TxFrom]
// is asked for another.
type txValue struct {
	tx  any
	typ reflect.Type
}

// WithTx returns a copy of ctx that carries tx and key. An integration calls
// it inside fn, so that the handler it runs finds both with [TxFrom] and
// [KeyFrom].
func WithTx[Tx any](ctx context.Context, tx Tx, key Key) context.Context {
	v := txValue{tx: tx, typ: reflect.TypeFor[Tx]()}
	return context.WithValue(context.WithValue(ctx, txContextKey{}, v), keyContextKey{}, key)
}

// TxFrom returns the transaction that [WithTx] put in ctx. ok is false when
// ctx carries none: a request or call the integration does not guard
// (another method, an optional key left out). Check it: the handler must
// not act without the transaction.
//
// Asking for another type than the one the context carries (TxFrom[*sql.Tx]
// under a Guard of pgx.Tx) is a programming error that no request can
// cause or cure: TxFrom panics with a *[txTypeError] that names both types,
// at its call, before the handler's first write, rather than return a nil
// transaction that the handler would use.
func TxFrom[Tx any](ctx context.Context) (tx Tx, ok bool) {
	v, found := ctx.Value(txContextKey{}).(txValue)
	if !found {
		return tx, false
	}
	if tx, ok = v.tx.(Tx); ok || (v.tx == nil && v.typ == reflect.TypeFor[Tx]()) {
		return tx, ok
	}
	panic(&txTypeError{Want: reflect.TypeFor[Tx]().String(), Have: v.typ.String()})
}

// txTypeError is the panic of [TxFrom] asked for a transaction type other
// than the one the context carries: the type parameter of TxFrom differs
// from the Guard's Tx. Recover middleware logs it as an error.
type txTypeError struct {
	// Want is the type TxFrom was asked for, as Go writes it ("*sql.Tx").
	Want string
	// Have is the type of the transaction the context carries: the Guard's
	// Tx ("pgx.Tx").
	Have string
}

func (e *txTypeError) Error() string {
	return fmt.Sprintf("idempotency: TxFrom[%s] called on a context whose transaction is a %s (the Guard's Tx type): call TxFrom[%s]",
		e.Want, e.Have, e.Have)
}

// KeyFrom returns the key that [WithTx] put in ctx.
func KeyFrom(ctx context.Context) (Key, bool) {
	k, ok := ctx.Value(keyContextKey{}).(Key)
	return k, ok
}
