// Package httpapi is sbx's HTTP API (see docs/api.md): it decodes and bounds requests, calls the
// coordinator.Service and encodes its answers. It is the one place where domain error codes become
// HTTP statuses.
package httpapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path"
	"sync"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/api"
)

// Bounds of every request.
const (
	// MaxBodyBytes is the largest request body accepted.
	MaxBodyBytes = 1 << 20
	// MaxHeaderBytes is the largest request header block accepted.
	MaxHeaderBytes = 64 << 10
	// ReadHeaderTimeout bounds how long a client may take to send its headers.
	ReadHeaderTimeout = 10 * time.Second
	// DefaultBodyTimeout bounds how long a client may take to send its body, unless
	// Config.BodyTimeout says otherwise. It holds for every route (see boundBody). There is no
	// server-wide ReadTimeout or WriteTimeout: waits and output streams legitimately last up to
	// hours, and they are bounded by their own parameters instead.
	DefaultBodyTimeout = 30 * time.Second
	// IdleTimeout closes keep-alive connections left unused.
	IdleTimeout = 2 * time.Minute
	// ShutdownTimeout bounds Serve's graceful shutdown.
	ShutdownTimeout = 5 * time.Second
)

// Config holds the server's settings; zero values mean the defaults.
type Config struct {
	// Token, when set, is required as "Authorization: Bearer TOKEN" on every call but the probes.
	Token string
	// AllowedHosts are the names a request's Host header may carry besides the loopback ones
	// (localhost, 127.0.0.1, [::1]): "sbx.example.com", "10.0.0.5"; a port is ignored. AnyHost
	// accepts every name. See guardBrowsers.
	AllowedHosts []string
	// BodyTimeout bounds how long a client may take to send a request's body (default
	// DefaultBodyTimeout).
	BodyTimeout time.Duration
	// MaxConns bounds the connections open at a time (default DefaultMaxConns), and
	// MaxConnsPerClient those from one client IP (default DefaultMaxConnsPerClient). A connection
	// past either is closed at once (connlimit.go).
	MaxConns          int
	MaxConnsPerClient int
	// TLS, when set, makes Open serve HTTPS (and HTTP/2) with it.
	TLS *tls.Config
	// Handlers are more routes, as http.ServeMux patterns ("/mcp", "POST /hook/{id}"), served behind
	// the same checks as /v1: Host and Origin, the token, the body's bounds and its Content-Type.
	Handlers map[string]http.Handler
	// Enroll, when set, serves POST /v1/enroll, which checks the enroll key instead of the token:
	// every other check still holds for it.
	Enroll *Enroller
	// Logger receives internal errors, which the API hides from clients (default: discard).
	Logger *slog.Logger
	// Ready reports the readiness of what the service depends on (store open, NATS connected);
	// /readyz also requires at least one runner. Nil means nothing more to check.
	Ready func(context.Context) error
	// Role reports whether this coordinator leads (holds the lease of the duties that must happen
	// once) and the ID of the one that does ("" while none is known), for /readyz and /metrics. Nil
	// means a single coordinator, which leads.
	Role func() (leading bool, leader string)
	// Version is the build's version, reported by /healthz.
	Version string
}

// Server serves the API of one coordinator.Service, or a standby's forwarder (NewForwarder).
type Server struct {
	svc     *coordinator.Service // nil in a forwarder
	leader  func() (id, url string)
	cfg     Config
	log     *slog.Logger
	handler http.Handler
	codes   codeCounter

	// ctx is the base context of every request; Close cancels it so that long waits and output
	// streams end instead of holding the shutdown up.
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup // the Serve goroutine
	served  chan struct{}  // closed when the Serve goroutine ends
	mu      sync.Mutex
	srv     *http.Server   // set by Open
	conns   *limitListener // set by Open
	stopped bool           // by StopAccepting
	err     error          // of Serve, other than ErrServerClosed
}

// NewServer returns a Server of svc. It does not listen: see Open, or use Handler.
func NewServer(svc *coordinator.Service, cfg Config) *Server {
	s := newServer(svc, cfg)
	// boundBody comes first: every answer, refusals included, may wait for the body to drain.
	s.handler = s.countCodes(s.boundBody(s.guardBrowsers(s.authenticate(s.readBody(s.routes())))))
	return s
}

// newServer fills in cfg's defaults; the caller sets the handler.
func newServer(svc *coordinator.Service, cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.MaxConnsPerClient <= 0 {
		cfg.MaxConnsPerClient = DefaultMaxConnsPerClient
	}
	s := &Server{svc: svc, cfg: cfg, log: cfg.Logger, served: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Handler returns the API's handler, with every check and the metrics, for tests and for callers
// that run their own http.Server.
func (s *Server) Handler() http.Handler { return s.handler }

// Open serves the API on ln in a goroutine until Close; call it once. Listening is the caller's job
// so that an address like 127.0.0.1:0 is known before Open is called. Open bounds ln's connections
// (Config.MaxConns, Config.MaxConnsPerClient).
func (s *Server) Open(ln net.Listener) {
	limited := newLimitListener(ln, s.cfg.MaxConns, s.cfg.MaxConnsPerClient)
	ln = limited
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return s.ctx },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		TLSConfig:         s.cfg.TLS,
	}
	s.mu.Lock()
	s.srv, s.conns = srv, limited
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(s.served)
		var err error
		if srv.TLSConfig != nil {
			err = srv.ServeTLS(ln, "", "") // the certificate is in TLSConfig
		} else {
			err = srv.Serve(ln)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if !errors.Is(err, http.ErrServerClosed) && !(s.stopped && errors.Is(err, net.ErrClosed)) {
			s.err = err
		}
	}()
}

// StopAccepting closes the listener Open was given and ends keep-alives, so that the connections
// the server holds close after the call in progress; it serves those calls until Close. A
// standby's forwarder stops so when its process takes the lead, and the API takes the socket
// over (Handoff).
func (s *Server) StopAccepting() error {
	s.mu.Lock()
	srv, conns := s.srv, s.conns
	s.stopped = true
	s.mu.Unlock()
	if srv == nil {
		return errors.New("http api: not open")
	}
	srv.SetKeepAlivesEnabled(false)
	return conns.Close()
}

// Close ends the waits and streams in progress, then shuts the server down gracefully: it returns
// when every request has finished, or when ctx ends, after cutting the connections still open. It
// returns Serve's error, if Serve failed.
func (s *Server) Close(ctx context.Context) error {
	s.cancel()
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	err := srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		// A handler that did not end with its request's context (a long-lived stream) holds the
		// shutdown: past the grace its connection is cut, which is what stopping means.
		s.log.Warn("http api: requests still open after the shutdown grace; closing their connections")
		err = srv.Close()
	}
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(err, s.err)
}

// Serve serves the API on ln until ctx ends, then closes it as Close does, within ShutdownTimeout.
// Serving never stops by itself: when it does (the listener failed), Serve returns the error at
// once, so that whoever supervises the process notices.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.Open(ln)
	select {
	case <-ctx.Done():
	case <-s.served:
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
	defer cancel()
	if err := s.Close(shutdown); err != nil {
		return fmt.Errorf("http api: %w", err)
	}
	return nil
}

// routes registers every endpoint. Unknown paths get a JSON 404, and so do paths with "." or ".."
// segments or doubled slashes; known paths with another method get a JSON 405 (see notFound).
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+api.RouteJobs, s.handleStart)
	mux.HandleFunc("GET "+api.RouteJobs, s.handleJobs)
	mux.HandleFunc("GET "+api.RouteJob, s.handleJob)
	mux.HandleFunc("GET "+api.RouteJobWait, s.handleWait)
	mux.HandleFunc("GET "+api.RouteSleep, s.handleSleep)
	mux.HandleFunc("GET "+api.RouteJobOutput, s.handleOutput)
	mux.HandleFunc("POST "+api.RouteJobKill, s.handleKill)
	mux.HandleFunc("POST "+api.RouteJobStdin, s.handleStdin)
	mux.HandleFunc("POST "+api.RouteJobResize, s.handleResize)
	mux.HandleFunc("GET "+api.RouteNotifications, s.handleNotifications)
	mux.HandleFunc("GET "+api.RouteNotificationsStream, s.handleStream)
	mux.HandleFunc("POST "+api.RouteAck, s.handleAck)
	mux.HandleFunc("POST "+api.RouteSessions, s.handleOpenSession)
	mux.HandleFunc("GET "+api.RouteSession, s.handleSession)
	mux.HandleFunc("POST "+api.RouteSessionRenew, s.handleRenew)
	mux.HandleFunc("DELETE "+api.RouteSession, s.handleEndSession)
	mux.HandleFunc("GET "+api.RouteRunners, s.handleRunners)
	mux.HandleFunc("GET "+api.RouteOpenAPI, s.handleOpenAPI)
	mux.HandleFunc("GET "+api.RouteHealthz, s.handleHealthz)
	mux.HandleFunc("GET "+api.RouteReadyz, s.handleReadyz)
	mux.HandleFunc("GET "+api.RouteMetrics, s.handleMetrics)
	if s.cfg.Enroll != nil {
		mux.Handle("POST "+api.RouteEnroll, s.cfg.Enroll)
	}
	for pattern, h := range s.cfg.Handlers {
		mux.Handle(pattern, h)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Any call carrying a session renews its lease; a session that is no session's id is
		// refused on every route, as it is where a session is used.
		if id := r.Header.Get(api.HeaderSession); id != "" {
			err := coordinator.CheckSession("Sbx-Session header", id)
			if err == nil {
				err = inScope(r, "Sbx-Session header", id)
			}
			if err != nil {
				s.writeError(w, r, err)
				return
			}
			s.svc.TouchSession(id)
		}
		if _, pattern := mux.Handler(r); pattern == "" || !cleanPath(r.URL.EscapedPath()) {
			s.notFound(mux, w, r)
			return
		}
		if err := s.checkPathScope(r); err != nil {
			s.writeError(w, r, err)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// cleanPath reports whether p has no "." or ".." segment and no doubled slash: the mux would
// redirect it to its cleaned form.
func cleanPath(p string) bool {
	c := path.Clean(p)
	return p == c || p == c+"/"
}
