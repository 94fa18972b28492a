package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/api"
)

// The HTTP layer's own codes; every other code is a domain one.
const (
	// codeMethodNotAllowed: a known path called with another method.
	codeMethodNotAllowed = "method_not_allowed"
	// codeForbidden: a Host that does not name the API, or a cross-origin browser request.
	codeForbidden = "forbidden"
	// codeUnsupportedMediaType: a body that is not sent as application/json.
	codeUnsupportedMediaType = "unsupported_media_type"
	// codeRequestTimeout: a body that did not arrive within the body timeout.
	codeRequestTimeout = "request_timeout"
	// codeRateLimited: an address refused too often lately (POST /v1/enroll).
	codeRateLimited = "rate_limited"
)

// statuses maps the domain's error codes to HTTP statuses. It is the only such mapping.
var statuses = map[string]int{
	coordinator.EINVALID:             http.StatusBadRequest,
	coordinator.EUNAUTHORIZED:        http.StatusUnauthorized,
	coordinator.ENOTFOUND:            http.StatusNotFound,
	codeMethodNotAllowed:             http.StatusMethodNotAllowed,
	codeForbidden:                    http.StatusForbidden,
	codeUnsupportedMediaType:         http.StatusUnsupportedMediaType,
	codeRequestTimeout:               http.StatusRequestTimeout,
	codeRateLimited:                  http.StatusTooManyRequests,
	coordinator.ECONFLICT:            http.StatusConflict,
	coordinator.EIDEMPOTENCY:         http.StatusConflict,
	coordinator.ETOOLARGE:            http.StatusRequestEntityTooLarge,
	coordinator.EINTERNAL:            http.StatusInternalServerError,
	coordinator.EUNAVAILABLE:         http.StatusServiceUnavailable,
	coordinator.EREADONLYUNAVAILABLE: http.StatusServiceUnavailable,
	coordinator.EOUTPUTBUDGET:        http.StatusServiceUnavailable,
	coordinator.EDISKLOW:             http.StatusServiceUnavailable,
}

// writeError writes err as the API's error. A *coordinator.Error is shown as it is; any other
// error is logged and hidden behind a generic message, except a request's cancellation, which only
// happens when the client went away or the server is shutting down.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code, msg := coordinator.ErrorCode(err), coordinator.ErrorMessage(err)
	switch {
	case code != coordinator.EINTERNAL:
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		code, msg = coordinator.EUNAVAILABLE, "The request was cancelled: the client went away or the server is shutting down."
	default:
		s.log.Error("http request", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeCode(w, code, msg)
}

// writeCode writes the API's error of code with msg, with code's status.
func writeCode(w http.ResponseWriter, code, msg string) {
	status, ok := statuses[code]
	if !ok {
		status = http.StatusInternalServerError
	}
	writeJSON(w, status, api.ErrorReply{Error: api.ErrorDetail{Code: code, Message: msg}})
}

// writeJSON writes v with the status. Encoding the API's own types cannot fail; a write error means
// the client went away, and there is no one left to tell.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// invalid returns an EINVALID error.
func invalid(format string, args ...any) error {
	return coordinator.Errorf(coordinator.EINVALID, format, args...)
}

// recorder captures what the mux's own 404 and 405 handlers write, to rewrite them as JSON.
type recorder struct {
	header http.Header
	code   int
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) Write(p []byte) (int, error) { return len(p), nil }
func (r *recorder) WriteHeader(code int)        { r.code = code }

// notFound answers a request that matched no pattern: a JSON 405 with Allow when the path exists
// with other methods, else a JSON 404. That includes the paths the mux would redirect to their
// cleaned form ("/v1/jobs/../../healthz" to "/healthz"): the API never redirects, so that a path
// built from an unescaped id cannot land on another route.
func (s *Server) notFound(mux *http.ServeMux, w http.ResponseWriter, r *http.Request) {
	h, _ := mux.Handler(r)
	rec := &recorder{header: http.Header{}, code: http.StatusOK}
	h.ServeHTTP(rec, r)
	if rec.code == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", rec.header.Get("Allow"))
		s.writeError(w, r, coordinator.Errorf(codeMethodNotAllowed, "%s is not allowed on %s; use %s.", r.Method, r.URL.Path, rec.header.Get("Allow")))
		return
	}
	s.writeError(w, r, coordinator.Errorf(coordinator.ENOTFOUND, "No endpoint %s %s; see docs/api.md.", r.Method, r.URL.Path))
}
