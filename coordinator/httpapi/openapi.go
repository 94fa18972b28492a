package httpapi

import (
	_ "embed"
	"net/http"
)

// openAPI is the OpenAPI 3.1 document of the API. It is checked against every reply of the
// package's tests (openapi_test.go), so that a field a handler adds or drops without it fails them.
//
//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the OpenAPI 3.1 document of the API, as GET /v1/openapi.json serves it.
func OpenAPI() []byte { return append([]byte(nil), openAPI...) }

// handleOpenAPI serves the document, behind the same checks as every /v1 route.
func (s *Server) handleOpenAPI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(openAPI) // a write error means the client went away
}
