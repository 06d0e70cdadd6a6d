package idemhttp

import (
	"net/http"
	"testing"
	"time"
)

// keyExpiry counts the time left by the server's clock from the attempt's
// sending, so a server clock ahead of or behind the client's does not
// move the bound later; it keeps the earlier of that and the field.
func TestKeyExpiryClocks(t *testing.T) {
	sent := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) string { return sent.Add(d).Format(http.TimeFormat) }
	cases := []struct {
		name, expires, date string
		want                time.Time
		ok                  bool
	}{
		{"no field", "", at(0), time.Time{}, false},
		{"not a date", "tomorrow", at(0), time.Time{}, false},
		{"no Date: the field by this clock", at(time.Hour), "", sent.Add(time.Hour), true},
		{"clocks agree", at(time.Hour), at(0), sent.Add(time.Hour - time.Second), true},
		{"server 2h ahead", at(3 * time.Hour), at(2 * time.Hour), sent.Add(time.Hour - time.Second), true},
		{"server 2h behind", at(-time.Hour), at(-2 * time.Hour), sent.Add(-time.Hour), true},
		{"bad Date: the field", at(time.Hour), "yesterday", sent.Add(time.Hour), true},
	}
	for _, c := range cases {
		h := http.Header{}
		if c.expires != "" {
			h.Set(HeaderKeyExpires, c.expires)
		}
		if c.date != "" {
			h.Set("Date", c.date)
		}
		got, ok := keyExpiry(&http.Response{Header: h}, sent)
		if ok != c.ok || !got.Equal(c.want) {
			t.Errorf("%s: %v, %v; want %v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}
