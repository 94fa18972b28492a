package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/api"
)

// readyTimeout bounds the readiness checks of one /readyz.
const readyTimeout = 5 * time.Second

// role is Config.Role's answer, or a single coordinator's.
func (s *Server) role() (leading bool, leader string) {
	if s.cfg.Role == nil {
		return true, ""
	}
	return s.cfg.Role()
}

// handleHealthz answers while the process serves: liveness only.
func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, api.Health{Status: "ok", Version: s.cfg.Version})
}

// handleReadyz answers 200 when a job can be submitted — the dependencies are ready (Config.Ready:
// for sbx, NATS and JetStream), there is room for its output (Service.RoomForJob) — and a runner is
// connected, else 503 naming what is missing. The 200 says whether this coordinator leads, and which
// does.
func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := s.cfg.Ready(ctx); err != nil {
			// The checks' errors name a dependency (the store, NATS, JetStream); they are meant for
			// operators.
			msg := err.Error()
			var ce *coordinator.Error
			if errors.As(err, &ce) {
				msg = ce.Message
			}
			s.writeError(w, r, coordinator.Errorf(coordinator.EUNAVAILABLE, "Not ready: %s.", strings.TrimSuffix(msg, ".")))
			return
		}
	}
	if err := s.svc.RoomForJob(); err != nil {
		s.writeError(w, r, coordinator.Errorf(coordinator.EUNAVAILABLE, "Not ready: %s", coordinator.ErrorMessage(err)))
		return
	}
	if len(s.svc.Runners()) == 0 {
		s.writeError(w, r, coordinator.Errorf(coordinator.EUNAVAILABLE, "Not ready: no runner is connected."))
		return
	}
	leading, leader := s.role()
	writeJSON(w, http.StatusOK, api.Ready{Status: "ok", Version: s.cfg.Version, Leader: leading, LeaderID: leader})
}
