package idempotency

import "context"

type txContextKey struct{}

type keyContextKey struct{}

// WithTx returns a copy of ctx that carries tx and key. An integration calls
// it inside fn, so that the handler it runs finds both with [TxFrom] and
// [KeyFrom].
func WithTx[Tx any](ctx context.Context, tx Tx, key Key) context.Context {
	return context.WithValue(context.WithValue(ctx, txContextKey{}, tx), keyContextKey{}, key)
}

// TxFrom returns the transaction that [WithTx] put in ctx. ok is false when
// ctx carries none, or one that is not a Tx.
func TxFrom[Tx any](ctx context.Context) (tx Tx, ok bool) {
	tx, ok = ctx.Value(txContextKey{}).(Tx)
	return tx, ok
}

// KeyFrom returns the key that [WithTx] put in ctx.
func KeyFrom(ctx context.Context) (Key, bool) {
	k, ok := ctx.Value(keyContextKey{}).(Key)
	return k, ok
}
