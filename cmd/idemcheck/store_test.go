package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
)

// TestStoreAccepted: every accepted -store form gives the right kind of
// store (and, for SQLite, the right path).
func TestStoreAccepted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ dsn, kind, path string }{
		{"", "sqlite", ""},
		{"keys.db", "sqlite", "keys.db"},
		{"./data/keys.sqlite", "sqlite", "./data/keys.sqlite"},
		{"/var/lib/app/KEYS.SQLITE3", "sqlite", "/var/lib/app/KEYS.SQLITE3"},
		{"sqlite:/tmp/any-name", "sqlite", "/tmp/any-name"},
		{"sqlite:relative/file", "sqlite", "relative/file"},
		{"file:/tmp/keys", "sqlite", "/tmp/keys"},
		{"file:keys.bin", "sqlite", "keys.bin"},
		{"file:///tmp/keys.db", "sqlite", "/tmp/keys.db"},
		{"postgres://u@h/db", "postgres", ""},
		{"postgresql://u:p@h:5433/db?sslmode=disable", "postgres", ""},
		{"mysql://root@127.0.0.1:3306/test", "mysql", ""},
		{"root@tcp(127.0.0.1:3306)/test", "mysql", ""},
		{"u:p@unix(/run/mysqld/mysqld.sock)/test", "mysql", ""},
		{"redis://127.0.0.1:6379", "redis", ""},
		{"redis://:secret@h:6380/2", "redis", ""},
		{"rediss://h:6380/0", "redis", ""},
	} {
		got, err := parseStore(tc.dsn)
		if err != nil {
			t.Errorf("parseStore(%q): %v", tc.dsn, err)
			continue
		}
		if got.kind != tc.kind || got.sqlite != tc.path {
			t.Errorf("parseStore(%q) = kind %q path %q, want %q %q", tc.dsn, got.kind, got.sqlite, tc.kind, tc.path)
		}
	}
	if got, _ := parseStore("rediss://h:6380/0"); got.rd == nil || got.rd.TLSConfig == nil {
		t.Errorf("rediss:// did not enable TLS: %+v", got.rd)
	}
}

// TestStoreRefused: anything else is refused with a *StoreError whose
// message says what is wrong and lists the accepted forms; nothing falls
// back to a SQLite file named after the value.
func TestStoreRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		dsn  string
		want string // in the reason
	}{
		{"127.0.0.1:6379", "for Redis write redis://127.0.0.1:6379"},
		{"localhost:5432", "for PostgreSQL write postgres://USER@localhost:5432/DB"},
		{"db.internal:3306", "for MySQL write mysql://USER@db.internal:3306/DB"},
		{"10.0.0.7:9999", "write it as a URL with its scheme"},
		{"[::1]:6379", "for Redis write redis://[::1]:6379"},
		{"keys", "not a recognised store"},
		{"payments.json", "not a recognised store"},
		{".db", "not a recognised store"},
		{"ftp://host/db", `unknown scheme "ftp"`},
		{"http://127.0.0.1:6379", `unknown scheme "http"`},
		{"sqlite:", "the path is empty"},
		{"file:", "the path is empty"},
		{"sqlite::memory:", "in-memory"},
		{"file:keys.db?mode=ro", "query string"},
		{"keys.db?_pragma=x", "not a recognised store"},
		{"file://host/keys.db", "empty host"},
		{"postgres://user@host:notaport/db", "invalid PostgreSQL URL"},
		{"mysql://root@127.0.0.1:3306/", "invalid MySQL URL"},
		{"mysql://root@127.0.0.1:3306/test?parseTime=maybe", "invalid MySQL URL"},
		{"root@tcp(127.0.0.1:3306)/", "unusable MySQL DSN"},
		{"root@tcp(127.0.0.1:3306)/test?autocommit=0", "unusable MySQL DSN"},
		{"redis://127.0.0.1:6379/notadb", "invalid Redis URL"},
	} {
		_, err := parseStore(tc.dsn)
		var se *StoreError
		if !errors.As(err, &se) {
			t.Errorf("parseStore(%q): err = %v, want a *StoreError", tc.dsn, err)
			continue
		}
		if se.Value != tc.dsn || !strings.Contains(se.Error(), tc.want) {
			t.Errorf("parseStore(%q): %q does not say %q", tc.dsn, se.Error(), tc.want)
		}
		for _, form := range []string{"postgres://", "mysql://", "tcp(host:3306)", "redis://", "rediss://", "sqlite:PATH", "file:PATH", ".sqlite3"} {
			if !strings.Contains(se.Error(), form) {
				t.Errorf("parseStore(%q): message does not list %q:\n%s", tc.dsn, form, se.Error())
			}
		}
	}
}

// TestStoreRefusedExit: the command refuses a bare host:port with exit
// status 2 and the list of accepted forms, and creates no file.
func TestStoreRefusedExit(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"-store", "127.0.0.1:6379"}, &out, &errb)
	if code != 2 || out.Len() != 0 {
		t.Errorf("exit %d, stdout %q; want 2 and nothing", code, out.String())
	}
	if !strings.Contains(errb.String(), `-store "127.0.0.1:6379": a bare host:port names no store; for Redis write redis://127.0.0.1:6379`) ||
		!strings.Contains(errb.String(), "accepted -store values:") {
		t.Errorf("stderr:\n%s", errb.String())
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("files created: %v", left)
	}
}
