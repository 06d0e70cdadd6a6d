package idemhttp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strings"

	"github.com/go-idempotency/idempotency"
)

// fingerprint hashes method, route, media type and body (canonical JSON for
// JSON media types, minus the ignored fields; the canonical form of an
// application/x-www-form-urlencoded body), then the configured header
// fields; or whatever Config.Fingerprint returns.
func (h *handler[Tx]) fingerprint(r *http.Request, body []byte) (string, error) {
	if h.c.fpFunc != nil {
		s, err := h.c.fpFunc(r, body)
		if err != nil {
			return "", err
		}
		return idempotency.Fingerprint([]byte(s)), nil
	}
	ct := r.Header.Get("Content-Type")
	media, _, err := mime.ParseMediaType(ct)
	if err != nil {
		media = strings.ToLower(strings.TrimSpace(ct))
	}
	if len(body) > 0 && isJSON(media) {
		canon, err := idempotency.CanonicalJSON(body)
		if err != nil {
			return "", err
		}
		if len(h.c.ignore) > 0 {
			if canon, err = dropFields(canon, h.c.ignore); err != nil {
				return "", err
			}
		}
		body = canon
	} else if len(body) > 0 && media == formMedia {
		canon, err := idempotency.CanonicalForm(body)
		if err != nil {
			return "", err
		}
		body = canon
	}
	parts := [][]byte{[]byte(r.Method), []byte(h.c.route(r)), []byte(media), body}
	for _, name := range h.c.fpHeaders {
		parts = append(parts, []byte(name), []byte(strings.Join(r.Header.Values(name), "\n")))
	}
	return idempotency.Fingerprint(parts...), nil
}

// dropFields removes the dot-separated paths from a canonical JSON value and
// canonicalizes the result again.
func dropFields(canon []byte, paths [][]string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(canon))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: %w", idempotency.ErrInvalidJSON, err)
	}
	for _, p := range paths {
		obj, ok := v.(map[string]any)
		for i := 0; ok && i < len(p)-1; i++ {
			obj, ok = obj[p[i]].(map[string]any)
		}
		if ok {
			delete(obj, p[len(p)-1])
		}
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", idempotency.ErrInvalidJSON, err)
	}
	return idempotency.CanonicalJSON(out)
}

// formMedia is the media type whose bodies are fingerprinted as forms.
const formMedia = "application/x-www-form-urlencoded"

func isJSON(media string) bool {
	return media == "application/json" || strings.HasSuffix(media, "+json")
}
