package httpapi

import (
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/sbx-dev/sbx/coordinator"
)

// AnyHost in Config.AllowedHosts accepts every Host header. It is only safe with a token: the Host
// check is what stops DNS rebinding (see guardBrowsers).
const AnyHost = "*"

// guardBrowsers keeps web pages away from the API. Every route is behind it, the probes too.
//
//   - Host must name the API: a loopback name (localhost, 127.0.0.1, [::1], any port) or one of
//     Config.AllowedHosts. This stops DNS rebinding: a page of evil.example whose name the attacker
//     re-points at 127.0.0.1 talks to the API as its own origin, so the browser sends no Origin and
//     reads the replies, but its requests carry Host: evil.example.
//   - A browser's cross-origin request is refused: Sec-Fetch-Site cross-site or same-site, or an
//     Origin that is not the API's own. Without this, any page could POST a command to the loopback
//     API: a text/plain form post needs no CORS preflight. Clients that are not browsers (curl, the
//     CLI, agent harnesses) send neither header and pass.
func (s *Server) guardBrowsers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.allowedHost(r.Host) {
			s.writeError(w, r, coordinator.Errorf(codeForbidden,
				"Host %q is not a name of this API: only loopback names are accepted unless the server is started with --allow-host NAME (this stops DNS rebinding).", r.Host))
			return
		}
		if site := r.Header.Get("Sec-Fetch-Site"); site == "cross-site" || site == "same-site" {
			s.writeError(w, r, coordinator.Errorf(codeForbidden,
				"Cross-origin browser requests are refused (Sec-Fetch-Site: %s): web pages must not drive the API.", site))
			return
		}
		if origin := r.Header.Get("Origin"); origin != "" && !sameOrigin(origin, r) {
			s.writeError(w, r, coordinator.Errorf(codeForbidden,
				"Cross-origin browser requests are refused (Origin: %s): web pages must not drive the API.", origin))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// allowedHost reports whether a Host header names this API.
func (s *Server) allowedHost(hostport string) bool {
	host := hostOnly(hostport)
	if host == "" {
		return false
	}
	if host == "localhost" {
		return true
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
		return true
	}
	for _, h := range s.cfg.AllowedHosts {
		if h == AnyHost || strings.EqualFold(hostOnly(h), host) {
			return true
		}
	}
	return false
}

// hostOnly is the lower-cased host of "host", "host:port", "[v6]" or "[v6]:port".
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		hostport = h
	}
	return strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]"))
}

// sameOrigin reports whether origin is the API's own: the request's scheme and Host.
func sameOrigin(origin string, r *http.Request) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false // "null" (sandboxed frames, file: pages) and garbage
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return u.Scheme == scheme && strings.EqualFold(u.Host, r.Host)
}
