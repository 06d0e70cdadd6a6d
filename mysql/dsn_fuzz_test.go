package mysql

import (
	"errors"
	"testing"

	"github.com/go-idempotency/idempotency"
)

// FuzzParseDSN: ParseDSN never panics; it either refuses a DSN with an
// error wrapping idempotency.ErrInvalidConfig or returns a configuration
// that names a database and an address.
func FuzzParseDSN(f *testing.F) {
	for _, s := range []string{
		"root@tcp(127.0.0.1:3306)/test",
		"u:p@unix(/run/mysqld/mysqld.sock)/test?parseTime=true",
		"mysql://root@127.0.0.1:3306/test",
		"mysql://u:p%40ss@db.example/shop?parseTime=true&timeout=5s",
		"mysql://root@[::1]/test?autocommit=0",
		"mysql://h/",
		"mysql:///db",
		":\xd2@", // a password of invalid UTF-8 once panicked in the redaction of the error
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dsn string) {
		cfg, err := ParseDSN(dsn)
		if err != nil {
			if !errors.Is(err, idempotency.ErrInvalidConfig) {
				t.Fatalf("ParseDSN(%q): %v, want an error wrapping ErrInvalidConfig", dsn, err)
			}
			return
		}
		if cfg.DBName == "" || cfg.Addr == "" {
			t.Fatalf("ParseDSN(%q) = %+v: no database or no address", dsn, cfg)
		}
	})
}
