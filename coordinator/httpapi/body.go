package httpapi

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
)

// boundBody puts the body timeout on every request that has a body, before anything else answers
// it. It must be the outermost check: whatever answers — a handler, a refusal, a 404 — net/http
// drains up to 256 KiB of unread body before it sends the reply, and without a deadline a client
// that stalls its body holds the reply and the connection forever. The deadline stays until the
// whole body has been read, so that it also bounds that drain; net/http lifts it then, as it starts
// watching the connection for the client going away, so that it cannot cut a long wait or stream.
func (s *Server) boundBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hasBody(r) {
			// Not every ResponseWriter supports deadlines (httptest's recorder does not); the size
			// bound still holds there.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
		}
		next.ServeHTTP(w, r)
	})
}

// readBody reads a request's whole body, within the deadline boundBody set and within
// MaxBodyBytes, and holds it to checkJSON, before the handler runs; the handler reads it from
// memory. A body must be JSON
// (Content-Type: application/json): a browser can send a text/plain or form body to any site
// without asking first, it cannot send JSON.
func (s *Server) readBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hasBody(r) {
			next.ServeHTTP(w, r)
			return
		}
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			s.writeError(w, r, coordinator.Errorf(codeUnsupportedMediaType,
				"A request with a body needs the header Content-Type: application/json (got %q).", r.Header.Get("Content-Type")))
			return
		}
		data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
		var ne net.Error
		switch {
		case tooLarge(err):
			s.writeError(w, r, bodyTooLarge())
			return
		case errors.As(err, &ne) && ne.Timeout():
			// The deadline stays: the drain of the rest fails at once and the connection closes.
			s.writeError(w, r, coordinator.Errorf(codeRequestTimeout,
				"The body did not arrive within %s.", s.cfg.BodyTimeout))
			return
		case err != nil:
			s.writeError(w, r, invalid("body could not be read: %v.", err))
			return
		}
		// Held to the strict checks here rather than in each route's decoder, so that the mounted
		// handlers' bodies (an MCP message) are too: a command must not run rewritten whichever way
		// it came in.
		if err := checkJSON(data); err != nil {
			s.writeError(w, r, err)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(data))
		next.ServeHTTP(w, r)
	})
}

// hasBody reports whether a request comes with a body: a Content-Length above 0, or none and a
// chunked body (-1). HTTP/2 requests always have a Body, so the length is what tells.
func hasBody(r *http.Request) bool { return r.ContentLength != 0 }
