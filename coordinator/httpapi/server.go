// Package httpapi is sbx's HTTP API (see API.md): it decodes and bounds requests, calls the
// coordinator.Service and encodes its answers. It is the one place where domain error codes become
// HTTP statuses.
package httpapi

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
)

// Bounds of every request.
const (
	// MaxBodyBytes is the largest request body accepted.
	MaxBodyBytes = 1 << 20
	// MaxHeaderBytes is the largest request header block accepted.
	MaxHeaderBytes = 64 << 10
	// ReadHeaderTimeout bounds how long a client may take to send its headers.
	ReadHeaderTimeout = 10 * time.Second
	// BodyTimeout bounds how long a client may take to send its body. There is no server-wide
	// ReadTimeout or WriteTimeout: waits and output streams legitimately last up to hours, and they
	// are bounded by their own parameters instead.
	BodyTimeout = 30 * time.Second
	// IdleTimeout closes keep-alive connections left unused.
	IdleTimeout = 2 * time.Minute
)

// Config holds the server's settings; zero values mean the defaults.
type Config struct {
	// Token, when set, is required as "Authorization: Bearer TOKEN" on every /v1 call.
	Token string
	// Logger receives internal errors, which the API hides from clients (default: discard).
	Logger *slog.Logger
	// Ready reports the readiness of what the service depends on (store open, NATS connected);
	// /readyz also requires at least one runner. Nil means nothing more to check.
	Ready func(context.Context) error
	// Version is the build's version, reported by /healthz.
	Version string
}

// Server serves the API of one coordinator.Service.
type Server struct {
	svc     *coordinator.Service
	cfg     Config
	log     *slog.Logger
	handler http.Handler
	codes   codeCounter

	// ctx is the base context of every request; Close cancels it so that long waits and output
	// streams end instead of holding the shutdown up.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the Serve goroutine
	mu     sync.Mutex
	srv    *http.Server // set by Open
	err    error        // of Serve, other than ErrServerClosed
}

// NewServer returns a Server of svc. It does not listen: see Open, or use Handler.
func NewServer(svc *coordinator.Service, cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{svc: svc, cfg: cfg, log: cfg.Logger}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.handler = s.countCodes(s.authenticate(s.routes()))
	return s
}

// Handler returns the API's handler, with authentication and metrics, for tests and for callers
// that run their own http.Server.
func (s *Server) Handler() http.Handler { return s.handler }

// Open serves the API on ln in a goroutine until Close; call it once. Listening is the caller's job
// so that an address like 127.0.0.1:0 is known before Open is called.
func (s *Server) Open(ln net.Listener) {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: ReadHeaderTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
		BaseContext:       func(net.Listener) context.Context { return s.ctx },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.mu.Lock()
	s.srv = srv
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
		}
	}()
}

// Close ends the waits and streams in progress, then shuts the server down gracefully: it returns
// when every request has finished or ctx ends. It returns Serve's error, if Serve failed.
func (s *Server) Close(ctx context.Context) error {
	s.cancel()
	s.mu.Lock()
	srv := s.srv
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	err := srv.Shutdown(ctx)
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(err, s.err)
}

// routes registers every endpoint. Unknown paths get a JSON 404 and known paths with another method
// a JSON 405 (see notFound).
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/jobs", s.handleStart)
	mux.HandleFunc("GET /v1/jobs", s.handleJobs)
	mux.HandleFunc("GET /v1/jobs/{id}", s.handleJob)
	mux.HandleFunc("GET /v1/jobs/{id}/wait", s.handleWait)
	mux.HandleFunc("GET /v1/wait", s.handleSleep)
	mux.HandleFunc("GET /v1/jobs/{id}/output", s.handleOutput)
	mux.HandleFunc("POST /v1/jobs/{id}/kill", s.handleKill)
	mux.HandleFunc("POST /v1/jobs/{id}/stdin", s.handleStdin)
	mux.HandleFunc("GET /v1/notifications", s.handleNotifications)
	mux.HandleFunc("GET /v1/notifications/stream", s.handleStream)
	mux.HandleFunc("POST /v1/notifications/ack", s.handleAck)
	mux.HandleFunc("POST /v1/sessions", s.handleOpenSession)
	mux.HandleFunc("GET /v1/sessions/{id}", s.handleSession)
	mux.HandleFunc("POST /v1/sessions/{id}/renew", s.handleRenew)
	mux.HandleFunc("DELETE /v1/sessions/{id}", s.handleEndSession)
	mux.HandleFunc("GET /v1/runners", s.handleRunners)
	mux.HandleFunc("GET /healthz", s.handleHealthz)
	mux.HandleFunc("GET /readyz", s.handleReadyz)
	mux.HandleFunc("GET /metrics", s.handleMetrics)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Any call carrying a session renews its lease.
		if id := r.Header.Get("Sbx-Session"); id != "" {
			s.svc.TouchSession(id)
		}
		if _, pattern := mux.Handler(r); pattern == "" {
			s.notFound(mux, w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}
