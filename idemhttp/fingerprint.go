package idemhttp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strings"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/canonical"
	"github.com/go-idempotency/idempotency/observe"
)

// fingerprint hashes method, route, media type and body (canonical JSON for
// JSON media types, minus the ignored fields; the canonical form of an
// application/x-www-form-urlencoded body), then the configured header
// fields; or whatever Options.Fingerprint returns.
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
		canon, err := canonical.JSON(body)
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
		canon, err := canonical.Form(body)
		if err != nil {
			return "", err
		}
		body = canon
	}
	return h.hash(r, media, body), nil
}

// hash is the fingerprint of r with media type media and body (canonical
// or not): method, route, media type, body, then the configured header
// fields.
func (h *handler[Tx]) hash(r *http.Request, media string, body []byte) string {
	parts := [][]byte{[]byte(r.Method), []byte(h.c.route(r)), []byte(media), body}
	for _, name := range h.c.fpHeaders {
		parts = append(parts, []byte(name), []byte(strings.Join(r.Header.Values(name), "\n")))
	}
	return idempotency.Fingerprint(parts...)
}

// byteForm answers a form request that met a record of another
// fingerprint (err, with resp and gev, is that answer) by trying the key
// again with the fingerprint of the body's bytes. That is what versions
// before CanonicalForm stored for a form body: a retry with the same bytes
// of a request stored then is the same request, and gets its answer
// instead of 422. Same bytes are the same parameters, so this never
// replays another request's answer. It costs one more round trip, only to
// a form body that is not in canonical form and met another fingerprint.
// The try is not counted by [Options].Quota: it replays, or refuses, a key
// the first try already counted.
func (h *handler[Tx]) byteForm(r *http.Request, key idempotency.Key, body []byte, fp string,
	fn func(Tx) (idempotency.Response, error), resp idempotency.Response, gev observe.Event, err error,
) (idempotency.Response, observe.Event, error) {
	media, _, perr := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if h.c.fpFunc != nil || perr != nil || media != formMedia || len(body) == 0 {
		return resp, gev, err
	}
	old := h.hash(r, media, body)
	if old == fp {
		return resp, gev, err
	}
	return h.g.DoEvent(r.Context(), key, old, fn)
}

// dropFields removes the dot-separated paths from a canonical JSON value and
// canonicalizes the result again.
func dropFields(canon []byte, paths [][]string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(canon))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: %w", idempotency.ErrInvalidBody, err)
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
		return nil, fmt.Errorf("%w: %w", idempotency.ErrInvalidBody, err)
	}
	return canonical.JSON(out)
}

// formMedia is the media type whose bodies are fingerprinted as forms.
const formMedia = "application/x-www-form-urlencoded"

func isJSON(media string) bool {
	return media == "application/json" || strings.HasSuffix(media, "+json")
}
