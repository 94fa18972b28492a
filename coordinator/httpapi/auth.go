package httpapi

import (
	"context"
	"net/http"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/api"
)

// openPaths stay reachable without the token, for probes and scrapers; the Host check still
// holds for them (guardBrowsers).
var openPaths = map[string]bool{api.RouteHealthz: true, api.RouteReadyz: true, api.RouteMetrics: true}

// authenticate requires the bearer token, or a scoped token derived from it (scope.go), on every
// call but the open paths when a token is configured. It fails closed: unknown paths need the token
// too, so they reveal nothing. A scoped token reaches only the paths of scopedPath, and its scope
// goes with the request for the routes to check.
//
// A call without the token is answered on a connection that then closes (Connection: close): only
// token holders keep connections alive, so that idle keep-alives of probes and strangers do not
// hold the server's connections (and file descriptors) for IdleTimeout.
func (s *Server) authenticate(next http.Handler) http.Handler {
	if s.cfg.Token == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		authed, scope := s.credential(r)
		if !authed {
			w.Header().Set("Connection", "close")
		}
		own := openPaths[r.URL.Path] || (s.cfg.Enroll != nil && r.URL.Path == api.RouteEnroll)
		if !own && !authed {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sbx"`)
			s.writeError(w, r, coordinator.Errorf(coordinator.EUNAUTHORIZED,
				"This call needs the header Authorization: Bearer TOKEN with the coordinator's token (SBX_TOKEN)."))
			return
		}
		if scope != "" {
			if !own && !scopedPath(r.URL.Path) {
				s.writeError(w, r, coordinator.Errorf(codeForbidden,
					"This token grants only the sessions whose id starts with %q; %s is not for it.", scope, r.URL.Path))
				return
			}
			r = r.WithContext(context.WithValue(r.Context(), scopeKey{}, scope))
		}
		next.ServeHTTP(w, r)
	})
}
