package testkit

import (
	"strconv"
	"testing"
	"time"
)

// TestClockArgs: a time.Time and an integer or string of digits near now
// in any Unix unit are seen; durations, small numbers and other strings
// are not.
func TestClockArgs(t *testing.T) {
	now := time.Now()
	var c ClockArgs
	c.See("none", int64(10*time.Minute), 42, "fp", "skew", []byte("x"), time.Minute)
	if n, sent := c.Sent(); n != 1 || len(sent) != 0 {
		t.Fatalf("after arguments that are no time: %d seen, %q; want 1, none", n, sent)
	}
	c.See("times", now, &now, now.Unix(), now.UnixMilli(), now.UnixMicro(), now.UnixNano(), strconv.FormatInt(now.UnixMilli(), 10), int(now.Unix()))
	if n, sent := c.Sent(); n != 2 || len(sent) != 8 {
		t.Fatalf("after eight readings of the clock: %d seen, %d flagged (%q); want 2, 8", n, len(sent), sent)
	}
}
