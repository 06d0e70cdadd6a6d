package idemhttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/go-idempotency/idempotency/backend"
)

// KeySchema describes the keys a [Options].ValidateKey accepts, so that
// [OpenAPI] can publish them; see [Options].KeySchema.
type KeySchema struct {
	// MinLength and MaxLength bound the key's length in bytes; zero means
	// 1 and 255 ([backend.MaxIDLen]).
	MinLength, MaxLength int
	// Format is the schema's format, such as "uuid"; "" for none.
	Format string
	// Pattern is an ECMA-262 regular expression the key matches; "" for
	// none.
	Pattern string
}

// uuidPattern is the form [UUIDKey] accepts.
const uuidPattern = "^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$"

// problemSchemaName is the name under components/schemas of the RFC 9457
// problem schema that the responses of [OpenAPI] refer to.
const problemSchemaName = "IdempotencyProblem"

// OpenAPIFragment is the OpenAPI 3.1 description of an operation guarded
// by [Middleware]: JSON-ready values (maps, slices, strings, numbers) to
// merge into a document, by hand or with [OpenAPIFragment.AddTo].
type OpenAPIFragment struct {
	// Parameter is the Parameter object of the key header: required
	// unless [Options].KeyOptional, with the key's length, format and
	// pattern ([Options].KeySchema).
	Parameter map[string]any
	// Headers are the Header objects, by field name, that a stored answer
	// and its replays carry: [HeaderReplayed] and [HeaderKeyExpires]. They
	// belong in the operation's own responses.
	Headers map[string]any
	// Responses are the Response objects, by status code, of the problems
	// the middleware answers itself: 400, 409 (or 425:
	// [Options].InProgressStatus), 413, 422, 429, 500 and 503, each an
	// application/problem+json document with its Retry-After, Link and
	// [HeaderKeyExpires] fields where it carries them.
	Responses map[string]any
	// Schemas are the Schema objects the responses refer to, by name under
	// #/components/schemas: IdempotencyProblem, RFC 9457's problem.
	Schemas map[string]any
}

// OpenAPI returns the OpenAPI 3.1 fragment of an operation guarded by
// [Middleware] with cfg (nil means the defaults). It does not need Scope;
// a field [Options.Validate] refuses for another reason gives its error,
// wrapping [idempotency.ErrInvalidConfig].
func OpenAPI(cfg *Options) (*OpenAPIFragment, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg == nil {
		cfg = &Options{}
	}
	header := cfg.KeyHeader
	if header == "" {
		header = DefaultKeyHeader
	}
	ks := KeySchema{MinLength: 1, MaxLength: backend.MaxIDLen}
	described := "1 to 255 printable ASCII characters"
	switch {
	case cfg.KeySchema != nil:
		ks = *cfg.KeySchema
		ks.MinLength = max(ks.MinLength, 1)
		if ks.MaxLength == 0 {
			ks.MaxLength = backend.MaxIDLen
		}
		described = "a key the service accepts"
	case cfg.ValidateKey != nil && reflect.ValueOf(cfg.ValidateKey).Pointer() == reflect.ValueOf(UUIDKey).Pointer():
		ks = KeySchema{MinLength: 36, MaxLength: 36, Format: "uuid", Pattern: uuidPattern}
		described = "a UUID"
	case cfg.ValidateKey != nil:
		described = "1 to 255 printable ASCII characters, further restricted by the service"
	}
	keySchema := map[string]any{"type": "string", "minLength": ks.MinLength, "maxLength": ks.MaxLength}
	if ks.Format != "" {
		keySchema["format"] = ks.Format
	}
	if ks.Pattern != "" {
		keySchema["pattern"] = ks.Pattern
	}
	f := &OpenAPIFragment{
		Parameter: map[string]any{
			"name": header, "in": "header", "required": !cfg.KeyOptional, "schema": keySchema,
			"description": "The idempotency key of this operation: " + described + ", bare or as a quoted sf-string. " +
				"A retry with the same key and the same request is answered with the stored response, without running " +
				"the operation again; the same key with another request is refused with 422.",
		},
		Headers: map[string]any{
			HeaderReplayed: map[string]any{
				"description": "Set to true when this response is a replay of the one stored with the key.",
				"schema":      map[string]any{"type": "string", "enum": []any{"true"}},
			},
			HeaderKeyExpires: keyExpiresHeader("Until when the key keeps this response (an IMF-fixdate, rounded down): " +
				"a retry sent before it is answered from the key; one sent after it may run the operation again."),
		},
		Schemas: map[string]any{problemSchemaName: problemSchema()},
	}
	inProgress := http.StatusConflict
	if cfg.InProgressStatus != 0 {
		inProgress = cfg.InProgressStatus
	}
	retry := map[string]any{
		"description": "Seconds to wait before retrying with the same key.",
		"schema":      map[string]any{"type": "integer", "minimum": 0},
	}
	problems := []struct {
		status int
		what   string
		extra  map[string]any
	}{
		{http.StatusBadRequest, "The " + header + " header is missing or invalid, or the request body could not be read " +
			"or is not valid JSON. Nothing was stored.", nil},
		{inProgress, "A request with the same key is in progress. Retry later with the same key.", map[string]any{
			"Retry-After": retry,
			HeaderKeyExpires: keyExpiresHeader("A lower bound of when the key will expire: the answer of the request " +
				"in progress is kept at least until then."),
		}},
		{http.StatusRequestEntityTooLarge, "The request body is too large. Nothing was stored.", nil},
		{http.StatusUnprocessableEntity, "The key was already used with another request (method, route or body).", nil},
		{http.StatusTooManyRequests, "Too many requests or keys. Retry later with the same key.", map[string]any{"Retry-After": retry}},
		{http.StatusInternalServerError, "The operation failed or the service is misconfigured; nothing was stored.", nil},
		{http.StatusServiceUnavailable, "The idempotency store is busy or unavailable; nothing was applied. " +
			"Retry later with the same key.", map[string]any{"Retry-After": retry}},
	}
	f.Responses = make(map[string]any, len(problems))
	for _, p := range problems {
		headers := map[string]any{}
		for k, v := range p.extra {
			headers[k] = v
		}
		if cfg.ProblemDocs != "" {
			headers["Link"] = map[string]any{
				"description": "The service's documentation of this problem (rel=\"describedby\").",
				"schema":      map[string]any{"type": "string"},
			}
		}
		resp := map[string]any{
			"description": p.what,
			"content": map[string]any{problemContentType: map[string]any{
				"schema": map[string]any{"$ref": "#/components/schemas/" + problemSchemaName},
			}},
		}
		if len(headers) > 0 {
			resp["headers"] = headers
		}
		f.Responses[strconv.Itoa(p.status)] = resp
	}
	return f, nil
}

func keyExpiresHeader(desc string) map[string]any {
	return map[string]any{
		"description": desc,
		"schema": map[string]any{"type": "string",
			"examples": []any{"Sun, 06 Nov 1994 08:49:37 GMT"}},
	}
}

// problemSchema is RFC 9457's problem details object.
func problemSchema() map[string]any {
	return map[string]any{
		"type":        "object",
		"description": "Problem details (RFC 9457).",
		"properties": map[string]any{
			"type":     map[string]any{"type": "string", "format": "uri-reference", "default": "about:blank"},
			"title":    map[string]any{"type": "string"},
			"status":   map[string]any{"type": "integer", "minimum": 100, "maximum": 599},
			"detail":   map[string]any{"type": "string"},
			"instance": map[string]any{"type": "string", "format": "uri-reference"},
		},
	}
}

// AddTo merges f into doc, an OpenAPI 3.1 document decoded with
// encoding/json into a map, for the operation at path and method, which
// must exist. It appends the key parameter (replacing a header parameter
// of the same name), adds [OpenAPIFragment].Headers to each response the
// operation declares inline that is not 5xx nor one of the fragment's
// problems, adds each problem response the operation does not declare,
// and puts the schemas in components. Values are copied: f can be added
// to several operations.
func (f *OpenAPIFragment) AddTo(doc map[string]any, path, method string) error {
	var cp OpenAPIFragment
	b, err := json.Marshal(f)
	if err == nil {
		err = json.Unmarshal(b, &cp)
	}
	if err != nil {
		return fmt.Errorf("idemhttp: copying the OpenAPI fragment: %w", err)
	}
	paths, _ := doc["paths"].(map[string]any)
	item, _ := paths[path].(map[string]any)
	op, _ := item[strings.ToLower(method)].(map[string]any)
	if op == nil {
		return fmt.Errorf("idemhttp: the document has no operation %s %s", strings.ToUpper(method), path)
	}
	params, _ := op["parameters"].([]any)
	kept := params[:0:0]
	for _, p := range params {
		if m, ok := p.(map[string]any); ok && m["in"] == "header" &&
			strings.EqualFold(fmt.Sprint(m["name"]), fmt.Sprint(cp.Parameter["name"])) {
			continue
		}
		kept = append(kept, p)
	}
	op["parameters"] = append(kept, cp.Parameter)
	responses, _ := op["responses"].(map[string]any)
	if responses == nil {
		responses = map[string]any{}
		op["responses"] = responses
	}
	for code, r := range responses {
		m, ok := r.(map[string]any)
		if _, problem := cp.Responses[code]; !ok || problem || strings.HasPrefix(code, "5") || m["$ref"] != nil {
			continue
		}
		headers, _ := m["headers"].(map[string]any)
		if headers == nil {
			headers = map[string]any{}
			m["headers"] = headers
		}
		for name, h := range cp.Headers {
			headers[name] = h
		}
	}
	for code, r := range cp.Responses {
		if _, ok := responses[code]; !ok {
			responses[code] = r
		}
	}
	components, _ := doc["components"].(map[string]any)
	if components == nil {
		components = map[string]any{}
		doc["components"] = components
	}
	schemas, _ := components["schemas"].(map[string]any)
	if schemas == nil {
		schemas = map[string]any{}
		components["schemas"] = schemas
	}
	for name, s := range cp.Schemas {
		schemas[name] = s
	}
	return nil
}
