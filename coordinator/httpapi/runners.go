package httpapi

import (
	"net/http"

	"github.com/sbx-dev/sbx/coordinator/api"
)

// handleRunners lists the live runners as a bare JSON array, as docs/api.md has it.
func (s *Server) handleRunners(w http.ResponseWriter, r *http.Request) {
	runners := s.svc.Runners()
	out := make([]api.Runner, 0, len(runners))
	for _, rn := range runners {
		out = append(out, viewRunner(rn))
	}
	writeJSON(w, http.StatusOK, out)
}
