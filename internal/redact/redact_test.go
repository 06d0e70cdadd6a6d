package redact

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestDSN(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://postgres:S3cret@127.0.0.1:5432/test?sslmode=disable", "postgres://postgres:xxxxx@127.0.0.1:5432/test?sslmode=disable"},
		{"postgresql://u:p%40ss@h/db", "postgresql://u:xxxxx@h/db"},
		{"postgres://u@h/db?password=S3cret&sslmode=disable", "postgres://u@h/db?password=xxxxx&sslmode=disable"},
		{"postgres://u@h/db?sslpassword=S3cret", "postgres://u@h/db?sslpassword=xxxxx"},
		{"postgres://postgres@127.0.0.1:5432/test", "postgres://postgres@127.0.0.1:5432/test"},
		{"host=h user=u password=S3cret dbname=d", "host=h user=u password=xxxxx dbname=d"},
		{"host=h password='S3 cret' dbname=d", "host=h password='xxxxx' dbname=d"},
		{"mysql://root:S3cret@127.0.0.1:3306/test", "mysql://root:xxxxx@127.0.0.1:3306/test"},
		{"mysql://root:pa/ss@127.0.0.1:3306/test", "mysql://root:xxxxx@127.0.0.1:3306/test"},
		{"root:S3cret@tcp(127.0.0.1:3306)/test?parseTime=true", "root:xxxxx@tcp(127.0.0.1:3306)/test?parseTime=true"},
		{"root:S3cret@tcp(127.0.0.1:3306/test", "root:xxxxx@tcp(127.0.0.1:3306/test"},
		{"root:p@ss:w/rd@tcp(127.0.0.1:3306)/test", "root:xxxxx@tcp(127.0.0.1:3306)/test"},
		{"root@tcp(127.0.0.1:3306)/test", "root@tcp(127.0.0.1:3306)/test"},
		{"redis://u:S3cret@127.0.0.1:6379/0", "redis://u:xxxxx@127.0.0.1:6379/0"},
		{"rediss://:S3cret@127.0.0.1:6379", "rediss://:xxxxx@127.0.0.1:6379"},
		{"redis://127.0.0.1:6379/0?x=a@b", "redis://127.0.0.1:6379/0?x=a@b"},
		{"u:S3cret@127.0.0.1:6379", "u:xxxxx@127.0.0.1:6379"},
		{"sqlite:/tmp/a:b@c/keys.db", "sqlite:/tmp/a:b@c/keys.db"},
		{"./keys.db", "./keys.db"},
		{"", ""},
	} {
		if got := DSN(c.in); got != c.want {
			t.Errorf("DSN(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestText(t *testing.T) {
	const dsn = "mysql://root:S3cret%2F1@127.0.0.1:3306/test"
	for _, msg := range []string{
		fmt.Sprintf("parse %q: invalid port", dsn),
		"dsn " + dsn + " refused",
		"the password S3cret/1 was refused",
		"the password S3cret%2F1 was refused",
		fmt.Sprintf("%q", "S3cret/1"),
	} {
		got := Text(msg, dsn)
		if strings.Contains(got, "S3cret") {
			t.Errorf("Text(%q) = %q: the secret is still there", msg, got)
		}
		if !strings.Contains(got, Mask) {
			t.Errorf("Text(%q) = %q: no mask", msg, got)
		}
	}
	// A short secret is masked where it stands as a password only.
	const short = "postgres://pw:pw@h/db"
	if got, want := Text("user pw: postgres://pw:pw@h/db, password=pw", short), "user pw: postgres://pw:xxxxx@h/db, password=xxxxx"; got != want {
		t.Errorf("short secret: %q, want %q", got, want)
	}
	// A short secret may be any bytes, invalid UTF-8 included (found by
	// FuzzParseDSN): it is matched as bytes and never panics.
	if got, want := Text("password=\xd2 and :\xd2@", ":\xd2@"), "password=xxxxx and :xxxxx@"; got != want {
		t.Errorf("invalid UTF-8 secret: %q, want %q", got, want)
	}
	if got, want := Text("PASSWORD: '(.*' x", "u:(.*@tcp(h)/db"), "PASSWORD: 'xxxxx' x"; got != want {
		t.Errorf("secret with pattern bytes: %q, want %q", got, want)
	}
	if got := Text("no secret here", "./keys.db", ""); got != "no secret here" {
		t.Errorf("no secret: %q", got)
	}
}

func TestError(t *testing.T) {
	base := errors.New("sentinel")
	const dsn = "redis://u:S3cret@h:6379/0"
	err := Error(fmt.Errorf("open %s: %w", dsn, base), dsn)
	if strings.Contains(err.Error(), "S3cret") || !errors.Is(err, base) {
		t.Fatalf("Error: %q (Is base: %v)", err, errors.Is(err, base))
	}
	if Error(nil, dsn) != nil {
		t.Fatal("Error(nil) is not nil")
	}
}

func TestWriter(t *testing.T) {
	const dsn = "postgres://u:S3cret@h/db"
	var out bytes.Buffer
	w := Writer(&out, dsn)
	for _, part := range []string{"first S3", "cret line\nsecond ", "S3cret"} {
		if _, err := w.Write([]byte(part)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "first xxxxx line\nsecond xxxxx"; got != want {
		t.Fatalf("wrote %q, want %q", got, want)
	}
}
