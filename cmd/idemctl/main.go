// Command idemctl looks at and releases idempotency keys in a store, for
// operators.
//
// Usage:
//
//	idemctl -store DSN [-table NAME | -prefix P] [-json] [-timeout D] COMMAND [flags] [ID]
//
//	inspect -scope S [-body [-keyring FILE]] ID
//	                                   what the store holds for one key
//	list -scope S [-limit N] [-after CURSOR]
//	                                   one page of a scope's keys, unfinished and held ones first
//	forget -scope S ID                 delete one key: the next request with it runs again
//	purge [-dry-run] [-batch N]        delete the expired records (-dry-run: count them only)
//	stats                              the store's records by state
//
// inspect, list and forget require -scope: a key lives in one scope (the
// account a service names with it), and a key looked up in the wrong one
// has no record. An empty -scope (-scope= or -scope "") names the empty
// scope.
//
// The global flags may also follow the command. -store takes the forms
// idemcheck takes: postgres://..., mysql://... or user@tcp(host:port)/db,
// redis://host:port/db, sqlite:PATH, file:PATH or PATH.db (an existing
// file: idemctl never creates one). -table names the keys table of a SQL
// store (default idempotency_keys), -prefix the key prefix of Redis
// (default idempotency:). -json prints one JSON object instead of text.
// idemctl never creates or migrates a table.
//
// No output or error of idemctl shows the -store value's password (or any
// parameter that names a password or a token): it is shown as xxxxx.
//
// A record sealed by a Codec ([idempotency.Config].Codec, see package
// sealed) shows "sealed: yes". inspect -body shows a sealed body only
// with -keyring FILE, the keys that sealed it; without it the body line
// reads "sealed (give -keyring to open it)", and a keyring without the
// record's key fails with status 3. The file has one key a line, its id
// then its 32 bytes as 64 hexadecimal digits, and may name the current key
// (idemctl only opens, so it needs none):
//
//	# idempotency keyring: chmod 600
//	2026-01 8f1e0c4d2b7a9e3f5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b
//	2026-04 0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9
//	current 2026-04
//
// Blank lines and lines starting with # are ignored. The file must be a
// regular file that only its owner may read (mode 0600 or 0400): idemctl
// refuses one others can read, and never prints its content.
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
//     that is not printable ASCII, too long), no -scope, a bad -store,
//     -table, -limit, -after, -batch or -keyring, a SQLite file that does
//     not exist, or a command the store cannot do;
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
