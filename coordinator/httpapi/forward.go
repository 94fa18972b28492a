package httpapi

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/api"
)

// forwardDialTimeout bounds the connection to the coordinator that leads: one that does not answer
// within it is taken for dead, and the caller is told to retry (another takes over within seconds).
const forwardDialTimeout = 2 * time.Second

// NewForwarder returns the Server of a standby coordinator (docs/decisions.md, "Several
// coordinators"): it answers /healthz, /readyz and /metrics itself and forwards every other call,
// unchanged, to the coordinator that leads. leader gives that coordinator's id and URL, or "" for
// the URL while none is known (the call is answered 503, to be retried). The token and the
// browser checks hold here too, so that a stranger's calls cost the leader nothing; the leader
// checks every call again, bodies included, as it does its own.
func NewForwarder(cfg Config, leader func() (id, url string)) *Server {
	if cfg.Role == nil { // for /metrics: a forwarder does not lead
		cfg.Role = func() (bool, string) { id, _ := leader(); return false, id }
	}
	s := newServer(nil, cfg)
	s.leader = leader
	s.handler = s.countCodes(s.boundBody(s.guardBrowsers(s.authenticate(s.forwardRoutes()))))
	return s
}

// leaderURLKey carries the leader's URL, parsed once per call, from forwardRoutes to the proxy.
type leaderURLKey struct{}

func (s *Server) forwardRoutes() http.Handler {
	transport := &http.Transport{
		Proxy:                 nil, // coordinators talk to each other directly
		DialContext:           (&net.Dialer{Timeout: forwardDialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   forwardDialTimeout,
		IdleConnTimeout:       IdleTimeout,
		MaxIdleConnsPerHost:   64,
		ForceAttemptHTTP2:     true,
		ExpectContinueTimeout: time.Second,
	}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// SetURL leaves Out.Host empty, so the leader sees its own address in Host: the name
			// it allows (--advertise), whatever name the client used to reach this coordinator.
			pr.SetURL(pr.In.Context().Value(leaderURLKey{}).(*url.URL))
			pr.SetXForwarded()
		},
		Transport: transport,
		// Waits, SSE and output streams go through as they are written.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
				return // the client went away
			}
			s.log.Warn("forwarding to the coordinator that leads failed", "method", r.Method, "path", r.URL.Path, "err", err)
			s.writeError(w, r, coordinator.Errorf(coordinator.EUNAVAILABLE,
				"This coordinator is a standby and the coordinator that leads did not answer; retry in a few seconds (a standby takes over when the leader is gone)."))
		},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.handleHealthz)
	mux.HandleFunc("GET /readyz", s.handleStandbyReadyz)
	mux.HandleFunc("GET /metrics", s.handleMetrics)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		_, raw := s.leader()
		u, err := url.Parse(raw)
		if raw == "" || err != nil {
			s.writeError(w, r, coordinator.Errorf(coordinator.EUNAVAILABLE,
				"This coordinator is a standby and no coordinator leads yet; retry in a few seconds."))
			return
		}
		proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), leaderURLKey{}, u)))
	})
	return mux
}

// handleStandbyReadyz is a standby's /readyz: ready while it knows a coordinator that leads, the
// one it forwards to.
func (s *Server) handleStandbyReadyz(w http.ResponseWriter, r *http.Request) {
	id, u := s.leader()
	if u == "" {
		s.writeError(w, r, coordinator.Errorf(coordinator.EUNAVAILABLE, "Not ready: this coordinator is a standby and no coordinator leads yet."))
		return
	}
	writeJSON(w, http.StatusOK, api.Ready{Status: "ok", Version: s.cfg.Version, LeaderID: id})
}
