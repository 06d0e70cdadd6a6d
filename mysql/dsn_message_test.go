package mysql_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/mysql"
)

// TestParseDSNOtherScheme: a PostgreSQL or Redis URL given to the MySQL
// store says what it is and what a MySQL DSN looks like, before anything
// is sent (the driver's own message was "default addr for network ...
// unknown").
func TestParseDSNOtherScheme(t *testing.T) {
	t.Parallel()
	for dsn, want := range map[string]string{
		"postgres://postgres@127.0.0.1:5432/test": "a postgres:// URL is a PostgreSQL URL (use the postgres package), not a MySQL DSN; write mysql://user:pass@host:3306/db or user:pass@tcp(host:3306)/db",
		"postgresql://u@h/db?sslmode=disable":     "a postgresql:// URL is a PostgreSQL URL",
		"redis://127.0.0.1:6379/0":                "a redis:// URL is a Redis URL (use the redis package)",
		"http://127.0.0.1:3306/test":              "a http:// URL is another kind of URL, not a MySQL DSN",
	} {
		_, err := mysql.ParseDSN(dsn)
		if !errors.Is(err, idempotency.ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseDSN(%q) = %v, want ErrInvalidConfig saying %q", dsn, err, want)
		}
		if _, err := mysql.Open(context.Background(), dsn); !errors.Is(err, idempotency.ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q) = %v, want ErrInvalidConfig saying %q", dsn, err, want)
		}
	}
	// A password holding "://" is no scheme.
	if _, err := mysql.ParseDSN("root:a://b@tcp(127.0.0.1:3306)/test"); err != nil {
		t.Errorf("ParseDSN with :// in the password: %v", err)
	}
}

// TestParseDSNRedacts: no error of ParseDSN or Open holds the DSN's
// password, even where the URL parser quotes the DSN whole.
func TestParseDSNRedacts(t *testing.T) {
	t.Parallel()
	const secret = "Planted-S3cret"
	for _, dsn := range []string{
		"mysql://root:" + secret + "@[::1/test",
		"mysql://root:" + secret + "@h:99999x/test",
		"mysql://root:" + secret + "@h:3306/test?parseTime=maybe",
		"root:" + secret + "@tcp(127.0.0.1:3306/test",
		"root:" + secret + "@127.0.0.1:3306/test",
		"postgres://root:" + secret + "@h:5432/test",
	} {
		_, err := mysql.ParseDSN(dsn)
		if !errors.Is(err, idempotency.ErrInvalidConfig) || strings.Contains(err.Error(), secret) {
			t.Errorf("ParseDSN(%q) = %v: want ErrInvalidConfig without the password", dsn, err)
		}
		_, err = mysql.Open(context.Background(), dsn)
		if !errors.Is(err, idempotency.ErrInvalidConfig) || strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q) = %v: want ErrInvalidConfig without the password", dsn, err)
		}
	}
}
