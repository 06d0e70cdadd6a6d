// Command idemctl looks at and releases idempotency keys in a store, for
// operators.
//
// Usage:
//
//	idemctl -store DSN [-table NAME | -prefix P] [-json] [-timeout D] COMMAND [flags] [ID]
//
//	inspect [-body] [-scope S] ID      what the store holds for one key
//	list [-scope S] [-limit N] [-after CURSOR]
//	                                   one page of a scope's keys, unfinished and held ones first
//	forget [-scope S] ID               delete one key: the next request with it runs again
//	purge [-dry-run] [-batch N]        delete the expired records (-dry-run: count them only)
//	stats                              the store's records by state
//
// The global flags may also follow the command. -store takes the forms
// idemcheck takes: postgres://..., mysql://... or user@tcp(host:port)/db,
// redis://host:port/db, sqlite:PATH, file:PATH or PATH.db (an existing
// file: idemctl never creates one). -table names the keys table of a SQL
// store (default idempotency_keys), -prefix the key prefix of Redis
// (default idempotency:). -json prints one JSON object instead of text.
// idemctl never creates or migrates a table.
//
// list prints the cursor of the next page, to pass to -after: "u:ID" while
// the page ends among the unfinished and held keys, "r:ID" among the rest.
//
// Redis has no list, stats nor purge: its keys cannot be listed (a SCAN of
// a shared server is no listing), and its records expire by themselves.
// Those commands are refused there with exit status 2, before connecting.
//
// The exit status is:
//
//   - 0: done;
//   - 1: the key has no record (inspect, forget), or forget was refused
//     because the key is held (a request or an operation is running with
//     it: try again later);
//   - 2: bad usage or bad input, refused before anything is written: an
//     unknown command or flag, a key that cannot be one (an empty ID, a byte
//     that is not printable ASCII, too long), a bad -store, -table, -limit,
//     -after or -batch, a SQLite file that does not exist, or a command the
//     store cannot do;
//   - 3: the store failed: it cannot be reached, its table is missing, a
//     query failed or -timeout ran out.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
