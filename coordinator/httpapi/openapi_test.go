package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/sbx-dev/sbx/coordinator/httpapi"
)

// The contract: httpapi/openapi.json, loaded and validated once by an independent implementation
// of OpenAPI (kin-openapi), then checked against every request and reply of this package's tests
// (newHarnessWith serves its handler through checkContract).
var contract struct {
	once   sync.Once
	doc    *openapi3.T
	router routers.Router
	err    error
}

// maxCapture bounds what checkContract keeps of a body; a larger reply is checked for its status
// and headers only.
const maxCapture = 8 << 20

func loadContract(t *testing.T) (*openapi3.T, routers.Router) {
	t.Helper()
	contract.once.Do(func() {
		loader := openapi3.NewLoader()
		doc, err := loader.LoadFromData(httpapi.OpenAPI())
		if err != nil {
			contract.err = fmt.Errorf("load openapi.json: %w", err)
			return
		}
		if err := doc.Validate(loader.Context); err != nil {
			contract.err = fmt.Errorf("openapi.json is not a valid OpenAPI document: %w", err)
			return
		}
		// The document names the default address; the tests' servers listen elsewhere, and routes
		// are matched on their paths alone.
		doc.Servers = nil
		contract.doc = doc
		contract.router, contract.err = legacy.NewRouter(doc)
	})
	if contract.err != nil {
		t.Fatal(contract.err)
	}
	return contract.doc, contract.router
}

// capture passes a reply through and keeps its status and the first maxCapture bytes of its body.
type capture struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
	over   bool
}

func (c *capture) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.body.Len()+len(p) <= maxCapture {
		c.body.Write(p)
	} else {
		c.over = true
	}
	return c.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the server's writer (flushes, deadlines).
func (c *capture) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// teeBody keeps what the handler reads of a request's body.
type teeBody struct {
	io.ReadCloser
	buf bytes.Buffer
}

func (b *teeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.buf.Len()+n <= maxCapture {
		b.buf.Write(p[:n])
	}
	return n, err
}

// checkContract serves next and checks each exchange against the document, reporting every
// mismatch to fail: every reply of a documented operation against its responses (an error against
// the Error schema), a text/event-stream's events against the Notification schema, and a request
// that was answered 2xx against its operation's parameters and body. A path or a method that the
// document does not have may only be refused, with a JSON error if any body.
func checkContract(t *testing.T, next http.Handler, fail func(error)) http.Handler {
	doc, router := loadContract(t)
	opts := &openapi3filter.Options{
		IncludeResponseStatus: true,
		MultiError:            true,
		AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var tee *teeBody
		if r.Body != nil && r.Body != http.NoBody {
			tee = &teeBody{ReadCloser: r.Body}
			r.Body = tee
		}
		c := &capture{ResponseWriter: w}
		next.ServeHTTP(c, r) // a handler that aborts (panics) is not checked
		if c.status == 0 {
			c.status = http.StatusOK
		}
		errorf := func(format string, args ...any) {
			fail(fmt.Errorf("%s %s → %d: %s; body %.300q", r.Method, r.URL.RequestURI(), c.status, fmt.Sprintf(format, args...), c.body.String()))
		}
		ctype := w.Header().Get("Content-Type")
		route, params, err := router.FindRoute(r)
		if err != nil {
			if c.status >= 200 && c.status < 300 {
				errorf("a route the document lacks answered: %v", err)
			}
			if c.status >= 400 && strings.HasPrefix(ctype, "application/json") {
				if err := checkSchema(doc, "Error", c.body.Bytes()); err != nil {
					errorf("not the Error shape: %v", err)
				}
			}
			return
		}
		ctx := context.Background() // the request's ends with this call
		req := r.Clone(ctx)
		req.Body = http.NoBody
		if tee != nil {
			req.Body = io.NopCloser(bytes.NewReader(tee.buf.Bytes()))
		}
		in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
		if c.status >= 200 && c.status < 300 {
			if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
				errorf("the request was answered 2xx but is not the document's: %v", err)
			}
		}
		out := &openapi3filter.ResponseValidationInput{
			RequestValidationInput: in, Status: c.status, Header: w.Header(),
			Body: io.NopCloser(bytes.NewReader(c.body.Bytes())),
			Options: &openapi3filter.Options{
				IncludeResponseStatus: true, MultiError: true, ExcludeResponseBody: c.over,
			},
		}
		if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
			errorf("reply not the document's: %v", err)
		}
		if strings.HasPrefix(ctype, "text/event-stream") {
			sc := bufio.NewScanner(bytes.NewReader(c.body.Bytes()))
			sc.Buffer(nil, maxCapture)
			for sc.Scan() {
				if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
					if err := checkSchema(doc, "Notification", []byte(data)); err != nil {
						errorf("event not a Notification: %v", err)
					}
				}
			}
		}
	})
}

// checkSchema checks a JSON document against one of the document's schemas.
func checkSchema(doc *openapi3.T, name string, data []byte) error {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return doc.Components.Schemas[name].Value.VisitJSON(v, openapi3.EnableJSONSchema2020(), openapi3.MultiErrors())
}

func init() {
	// A stream's events are checked one by one (checkContract); as a whole it is text.
	openapi3filter.RegisterBodyDecoder("text/event-stream", openapi3filter.PlainBodyDecoder)
}

// TestOpenAPIServed: the document is served behind the token, as it is embedded.
func TestOpenAPIServed(t *testing.T) {
	h := newHarness(t, httpapi.Config{Token: "t"})
	h.get("/v1/openapi.json").wantError(t, 401, "unauthorized", "Bearer")
	r := h.get("/v1/openapi.json", "Authorization", "Bearer t")
	if r.status != http.StatusOK || r.header.Get("Content-Type") != "application/json" || !bytes.Equal(r.body, httpapi.OpenAPI()) {
		t.Fatalf("GET /v1/openapi.json: %d %s, %d bytes", r.status, r.header.Get("Content-Type"), len(r.body))
	}
	doc, _ := loadContract(t)
	if doc.OpenAPI != "3.1.0" {
		t.Errorf("openapi %q, want 3.1.0", doc.OpenAPI)
	}
}

// TestOpenAPIRoutes: every route of the server is in the document, and the document has no path
// the server lacks (/v1/enroll is served only with Config.Enroll).
func TestOpenAPIRoutes(t *testing.T) {
	doc, _ := loadContract(t)
	h := newHarness(t, httpapi.Config{})
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			// /v1/enroll is served only with Config.Enroll; the stream never ends by itself (TestStream
			// reads it).
			if path == "/v1/enroll" || path == "/v1/notifications/stream" {
				continue
			}
			p := strings.NewReplacer("{id}", "x1").Replace(path) + "?timeout_ms=0"
			var r *reply
			if method == http.MethodPost {
				r = h.post(p, "{}")
			} else {
				r = h.do(method, p, nil)
			}
			if r.status == http.StatusMethodNotAllowed || (r.status == http.StatusNotFound && strings.Contains(string(r.body), "No endpoint")) {
				t.Errorf("%s %s is documented, but the server has no such route: %d %s", method, path, r.status, r.body)
			}
		}
	}
}

// TestContractCatches: the check fails a reply with a field that the document lacks, one without a
// field it requires, and a status it does not list for the operation; it passes the same reply
// when it is as documented.
func TestContractCatches(t *testing.T) {
	sleep := `{"slept_ms":5}`
	for _, tc := range []struct {
		name, body string
		status     int
		want       string
	}{
		{"as documented", sleep, 200, ""},
		{"an undocumented field", `{"slept_ms":5,"extra":true}`, 200, "extra"},
		{"a missing field", `{}`, 200, "slept_ms"},
		{"a wrong type", `{"slept_ms":"5"}`, 200, "slept_ms"},
		{"an error of another shape", `{"message":"no"}`, 400, "error"},
		{"an undocumented status", sleep, 201, "slept_ms"},
		{"an undocumented route", sleep, 200, "route the document lacks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var errs []error
			var mu sync.Mutex
			fake := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			})
			srv := httptest.NewServer(checkContract(t, fake, func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }))
			defer srv.Close()
			path := "/v1/wait?timeout_ms=5"
			if strings.Contains(tc.name, "route") {
				path = "/v1/sleep"
			}
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			srv.Close() // waits for the handler, and so the check
			err = errors.Join(errs...)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("a documented reply failed the check: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("the check passed %s or failed without naming %q: %v", tc.body, tc.want, err)
			}
		})
	}
}
