// Package redact hides the secrets of a store DSN (its password, and the
// value of any parameter that names a password, a token or a secret) in
// whatever the project prints: a command's usage and errors, a store's
// errors that echo the DSN they were given.
//
// [Text] is the one redaction: [DSN], [Error] and [Writer] apply it. It
// knows the DSN forms the commands and the stores' Open functions take:
//
//	scheme://user:PASSWORD@host:port/db?password=PASSWORD&sslpassword=PASSWORD
//	user:PASSWORD@tcp(host:port)/db?params           (go-sql-driver/mysql)
//	host=h user=u password=PASSWORD sslpassword='PASS WORD'   (key=value)
//
// A secret is replaced by [Mask] wherever it appears in the text: in the
// DSN echoed whole (raw or quoted), and on its own. A secret of fewer than
// [MinBare] bytes is replaced only where it stands as a password (after
// "user:" and before "@", after "password="), so that a password such as
// "pw" does not mask every "pw" of a message.
package redact

import (
	"io"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Mask replaces a secret (the text the PostgreSQL driver prints too).
const Mask = "xxxxx"

// MinBare is the shortest secret replaced wherever it appears.
const MinBare = 4

// DSN returns dsn with its secrets replaced by [Mask]: the form to show.
func DSN(dsn string) string { return Text(dsn, dsn) }

// Text returns s with the secrets of each of dsns replaced by [Mask]. It is
// the project's one redaction: everything a command prints that may hold
// a DSN, or part of one, goes through it.
func Text(s string, dsns ...string) string {
	for _, dsn := range dsns {
		spans := secretSpans(dsn)
		if len(spans) == 0 {
			continue
		}
		masked := maskSpans(dsn, spans)
		s = strings.ReplaceAll(s, dsn, masked)
		if q, m := quoteInner(dsn), quoteInner(masked); q != dsn {
			s = strings.ReplaceAll(s, q, m)
		}
		var secrets []string
		for _, sp := range spans {
			secrets = append(secrets, variants(dsn[sp[0]:sp[1]])...)
		}
		// Longest first: a secret that contains another is masked whole.
		slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
		for _, v := range secrets {
			s = maskSecret(s, v)
		}
	}
	return s
}

// maskSecret replaces v in s: everywhere when it is long enough, else
// where it stands as a password.
func maskSecret(s, v string) string {
	if v == "" || v == Mask {
		return s
	}
	if len(v) >= MinBare {
		return strings.ReplaceAll(s, v, Mask)
	}
	s = strings.ReplaceAll(s, ":"+v+"@", ":"+Mask+"@")
	// The secret is matched as bytes, never compiled into a pattern: a
	// DSN's password may be any bytes, invalid UTF-8 included.
	var b strings.Builder
	last := 0
	for _, m := range passwordLeadRE.FindAllStringIndex(s, -1) {
		at := m[1]
		if at < last || !strings.HasPrefix(s[at:], v) {
			continue
		}
		end := at + len(v)
		if end < len(s) && !strings.ContainsRune("'\"\t\n\v\f\r &", rune(s[end])) {
			continue
		}
		b.WriteString(s[last:at])
		b.WriteString(Mask)
		last = end
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// passwordLeadRE is what stands before a password in a message:
// "password=", "password: ", optionally an opening quote.
var passwordLeadRE = regexp.MustCompile(`(?i)password\s*[=:]\s*['"]?`)

// variants are the forms a secret may take in a message: as written, URL
// decoded, URL encoded, and each of those as %q writes it.
func variants(secret string) []string {
	vs := []string{secret, url.QueryEscape(secret), url.PathEscape(secret)}
	if u, err := url.PathUnescape(secret); err == nil {
		vs = append(vs, u)
	}
	if u, err := url.QueryUnescape(secret); err == nil {
		vs = append(vs, u)
	}
	for _, v := range vs[:len(vs):len(vs)] {
		vs = append(vs, quoteInner(v))
	}
	slices.Sort(vs)
	return slices.Compact(vs)
}

// quoteInner is s as %q writes it, without the quotes.
func quoteInner(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// maskSpans replaces the byte ranges spans (sorted, disjoint) of s.
func maskSpans(s string, spans [][2]int) string {
	var b strings.Builder
	last := 0
	for _, sp := range spans {
		b.WriteString(s[last:sp[0]])
		b.WriteString(Mask)
		last = sp[1]
	}
	b.WriteString(s[last:])
	return b.String()
}

// schemeRE is a URL's scheme and its "://".
var schemeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// keywordRE is a secret of the key=value form: its value, bare or quoted.
var keywordRE = regexp.MustCompile(`(?i)(?:^|\s)(?:ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'?|[^\s]*)`)

// secretSpans returns the byte ranges of dsn's secrets, sorted and
// disjoint (empty ones left out).
func secretSpans(dsn string) [][2]int {
	if strings.HasPrefix(dsn, "sqlite:") || strings.HasPrefix(dsn, "file:") {
		return nil
	}
	var spans [][2]int
	add := func(from, to int) {
		if to > from {
			spans = append(spans, [2]int{from, to})
		}
	}
	query := -1
	if m := schemeRE.FindString(dsn); m != "" {
		// scheme://[user[:pass]@]host...: the authority ends at the first
		// '/', '?' or '#'. A password with an unescaped '/' puts the '@'
		// further: take the last '@' before the query then.
		start := len(m)
		rest := dsn[start:]
		end := strings.IndexAny(rest, "/?#")
		if end < 0 {
			end = len(rest)
		}
		at := strings.LastIndexByte(rest[:end], '@')
		if at < 0 {
			q := strings.IndexByte(rest, '?')
			if q < 0 {
				q = len(rest)
			}
			at = strings.LastIndexByte(rest[:q], '@')
		}
		if at >= 0 {
			if colon := strings.IndexByte(rest[:at], ':'); colon >= 0 {
				add(start+colon+1, start+at)
			}
		}
		if q := strings.IndexByte(rest[max(at, 0):], '?'); q >= 0 {
			query = start + max(at, 0) + q + 1
		}
	} else {
		// go-sql-driver/mysql: [user[:pass]@][net[(addr)]]/db[?params],
		// split as the driver does: at the last '/', then the last '@'.
		head := dsn
		if slash := strings.LastIndexByte(dsn, '/'); slash >= 0 {
			head = dsn[:slash]
			if q := strings.IndexByte(dsn[slash:], '?'); q >= 0 {
				query = slash + q + 1
			}
		}
		if at := strings.LastIndexByte(head, '@'); at >= 0 {
			if colon := strings.IndexByte(head[:at], ':'); colon >= 0 {
				add(colon+1, at)
			}
		}
		// key=value (PostgreSQL's keyword form).
		for _, m := range keywordRE.FindAllStringSubmatchIndex(dsn, -1) {
			from, to := m[2], m[3]
			if to > from && dsn[from] == '\'' {
				from++
				if to > from && dsn[to-1] == '\'' {
					to--
				}
			}
			add(from, to)
		}
	}
	if query >= 0 {
		pos := query
		for kv := range strings.SplitSeq(dsn[query:], "&") {
			k, _, hasValue := strings.Cut(kv, "=")
			if hasValue && secretParam(k) {
				add(pos+len(k)+1, pos+len(kv))
			}
			pos += len(kv) + 1
		}
	}
	return merge(spans)
}

// secretParam reports whether a DSN parameter's value is a secret.
func secretParam(name string) bool {
	n := strings.ToLower(name)
	if u, err := url.QueryUnescape(n); err == nil {
		n = u
	}
	for _, w := range []string{"pass", "secret", "token", "auth", "credential"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// merge sorts spans and joins those that overlap.
func merge(spans [][2]int) [][2]int {
	slices.SortFunc(spans, func(a, b [2]int) int { return a[0] - b[0] })
	var out [][2]int
	for _, sp := range spans {
		if n := len(out); n > 0 && sp[0] <= out[n-1][1] {
			out[n-1][1] = max(out[n-1][1], sp[1])
			continue
		}
		out = append(out, sp)
	}
	return out
}

// Error returns err with its message redacted of the secrets of dsns
// ([Text]); errors.Is and errors.As see err's chain unchanged. A nil err
// gives nil.
func Error(err error, dsns ...string) error {
	if err == nil {
		return nil
	}
	return &redacted{err: err, msg: Text(err.Error(), dsns...)}
}

// redacted is an error whose message is redacted.
type redacted struct {
	err error
	msg string
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }

// Writer returns a writer that writes to w what it is given with the
// secrets of dsns redacted ([Text]). It holds back an unfinished line, so
// that a secret split over two writes is still found: call Flush at the
// end.
func Writer(w io.Writer, dsns ...string) *LineWriter {
	return &LineWriter{w: w, dsns: dsns}
}

// LineWriter is the writer of [Writer]. It is safe for concurrent use.
type LineWriter struct {
	mu   sync.Mutex
	w    io.Writer
	dsns []string
	buf  []byte
}

// Write redacts and writes the complete lines of p (with those held back
// before); it reports len(p) unless w failed.
func (lw *LineWriter) Write(p []byte) (int, error) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	lw.buf = append(lw.buf, p...)
	i := strings.LastIndexByte(string(lw.buf), '\n')
	if i < 0 {
		return len(p), nil
	}
	out := Text(string(lw.buf[:i+1]), lw.dsns...)
	lw.buf = append(lw.buf[:0], lw.buf[i+1:]...)
	if _, err := io.WriteString(lw.w, out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes the unfinished line held back, redacted.
func (lw *LineWriter) Flush() error {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if len(lw.buf) == 0 {
		return nil
	}
	out := Text(string(lw.buf), lw.dsns...)
	lw.buf = lw.buf[:0]
	_, err := io.WriteString(lw.w, out)
	return err
}
