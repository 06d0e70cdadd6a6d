package redact

import (
	"net/url"
	"strings"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"
)

// FuzzText: Text never panics, and a message that echoes a DSN (whole, or
// its password alone) keeps no password of at least MinBare bytes that
// the URL parser or the MySQL driver reads from the DSN.
//
//	go test -run '^$' -fuzz '^FuzzText$' -fuzztime 30s ./internal/redact/
func FuzzText(f *testing.F) {
	for _, s := range []string{
		"postgres://u:S3cret@h/db", "mysql://root:p%40ss@h:3306/db", "root:p@ss:w/rd@tcp(h:3306)/db?x=1",
		"redis://:S3cret@h:6379/0", "host=h password='a b c d' user=u", "u:S3cret@h:6379",
		":\xd2@", "u:(.*@tcp(h)/db",
	} {
		f.Add(s, "error: ")
	}
	f.Fuzz(func(t *testing.T, dsn, prefix string) {
		var secrets []string
		if u, err := url.Parse(dsn); err == nil && u.User != nil && schemeRE.MatchString(dsn) {
			if p, ok := u.User.Password(); ok {
				secrets = append(secrets, p)
			}
		}
		if !schemeRE.MatchString(dsn) {
			if cfg, err := gomysql.ParseDSN(dsn); err == nil {
				secrets = append(secrets, cfg.Passwd)
			}
		}
		for _, p := range secrets {
			if len(p) < MinBare || strings.Contains(Mask, p) || strings.Contains(prefix, "x") {
				continue
			}
			for _, msg := range []string{prefix + dsn, prefix + `"` + dsn + `"`, prefix + p + " refused"} {
				if out := Text(msg, dsn); strings.Contains(out, p) {
					t.Fatalf("Text(%q, %q) = %q: the password %q is still there", msg, dsn, out, p)
				}
			}
		}
	})
}
