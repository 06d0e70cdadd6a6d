package idemhttp

import (
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// check returns an error wrapping [idempotency.ErrInvalidConfig] for the
// first field of c out of range, Scope aside (see [Options.Validate]).
func (c *Options) check() error {
	if c == nil {
		return nil
	}
	switch {
	case c.TTL < 0 || (c.TTL > 0 && c.TTL < time.Millisecond):
		return fmt.Errorf("%w: idemhttp Options.TTL %v is negative or under 1ms", idempotency.ErrInvalidConfig, c.TTL)
	case c.InProgressStatus != 0 && c.InProgressStatus != http.StatusConflict && c.InProgressStatus != http.StatusTooEarly:
		return fmt.Errorf("%w: idemhttp Options.InProgressStatus %d is neither 409 nor 425", idempotency.ErrInvalidConfig, c.InProgressStatus)
	}
	if err := checkDocs(c.ProblemDocs); err != nil {
		return err
	}
	if s := c.KeySchema; s != nil && (s.MinLength < 0 || s.MaxLength < 0 || s.MaxLength > backend.MaxIDLen ||
		(s.MaxLength > 0 && s.MinLength > s.MaxLength)) {
		return fmt.Errorf("%w: idemhttp Options.KeySchema lengths %d..%d outside 0..%d", idempotency.ErrInvalidConfig,
			s.MinLength, s.MaxLength, backend.MaxIDLen)
	}
	return nil
}

// checkDocs refuses a ProblemDocs that is not an absolute http(s) URL that
// fits in a Link field as it is.
func checkDocs(docs string) error {
	if docs == "" {
		return nil
	}
	for i := 0; i < len(docs); i++ {
		if c := docs[i]; c <= ' ' || c > '~' || c == '<' || c == '>' || c == '"' {
			return fmt.Errorf("%w: idemhttp Options.ProblemDocs has the byte %#02x at %d: "+
				"write it percent-encoded", idempotency.ErrInvalidConfig, c, i)
		}
	}
	u, err := url.Parse(docs)
	if err != nil {
		return fmt.Errorf("%w: idemhttp Options.ProblemDocs: %w", idempotency.ErrInvalidConfig, err)
	}
	if (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("%w: idemhttp Options.ProblemDocs %q is not an absolute http or https URL", idempotency.ErrInvalidConfig, docs)
	}
	return nil
}
