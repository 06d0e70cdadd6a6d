package idemhttp

import (
	"bytes"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// errResponseTooLarge is returned by capture.Write past the response limit.
var errResponseTooLarge = errors.New("idemhttp: response body larger than Options.MaxResponseBody")

// capture is the buffering ResponseWriter the handler writes to. It mimics
// net/http. The header is snapshotted at WriteHeader (or the first Write).
// The status defaults to 200, and informational statuses are dropped. The
// Content-Type is sniffed when the handler set none.
type capture struct {
	rw     http.ResponseWriter // only for read/write deadlines
	header http.Header         // what the handler sees
	sent   http.Header         // snapshot taken at WriteHeader
	status int
	body   bytes.Buffer
	limit  int64 // < 0: none
	over   bool  // a write went past limit
}

func newCapture(rw http.ResponseWriter, limit int64) *capture {
	return &capture{rw: rw, header: make(http.Header), limit: limit}
}

// Header implements http.ResponseWriter.
func (c *capture) Header() http.Header { return c.header }

// WriteHeader implements http.ResponseWriter. Only the first final status
// counts; 1xx statuses other than 101 cannot be buffered and are dropped.
func (c *capture) WriteHeader(code int) {
	if c.status != 0 || (code >= 100 && code <= 199 && code != http.StatusSwitchingProtocols) {
		return
	}
	c.status = code
	c.sent = c.header.Clone()
	if c.sent == nil {
		c.sent = make(http.Header)
	}
}

// Write implements http.ResponseWriter.
func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(c.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if c.over || (c.limit >= 0 && int64(c.body.Len())+int64(len(p)) > c.limit) {
		c.over = true
		return 0, errResponseTooLarge
	}
	return c.body.Write(p)
}

// SetReadDeadline lets http.ResponseController reach the connection.
func (c *capture) SetReadDeadline(t time.Time) error {
	return http.NewResponseController(c.rw).SetReadDeadline(t)
}

// SetWriteDeadline lets http.ResponseController reach the connection.
func (c *capture) SetWriteDeadline(t time.Time) error {
	return http.NewResponseController(c.rw).SetWriteDeadline(t)
}

// finish completes the response once the handler has returned: default
// status and sniffed Content-Type, as net/http would have sent them.
func (c *capture) finish() {
	if c.status == 0 {
		c.WriteHeader(http.StatusOK)
	}
	_, haveType := c.sent["Content-Type"]
	if !haveType && c.body.Len() > 0 && c.sent.Get("Content-Encoding") == "" && c.sent.Get("Transfer-Encoding") == "" {
		c.sent.Set("Content-Type", http.DetectContentType(c.body.Bytes()))
	}
}

// bodyAllowed reports whether a response with status may have a body.
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// writeResponse sends a buffered response: header fields are added to the
// ones already on w (set by outer middleware), replacing same-named ones.
// extra, if set, is called on the header last, before it is sent.
func writeResponse(w http.ResponseWriter, status int, header http.Header, body []byte, replayed bool, extra func(http.Header)) {
	h := w.Header()
	for k, v := range header {
		h[k] = v
	}
	if replayed {
		h.Set(HeaderReplayed, "true")
	}
	if extra != nil {
		extra(h)
	}
	if bodyAllowed(status) && h.Get("Content-Length") == "" && h.Get("Transfer-Encoding") == "" {
		h.Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	if len(body) > 0 && bodyAllowed(status) {
		_, _ = w.Write(body)
	}
}
