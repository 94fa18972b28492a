package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbx-dev/sbx/coordinator/client"
)

// Default bounds of the HTTP MCP sessions (SessionLimits). A session costs tens of KiB (its
// server, tools, transport and pusher): 10,000 initialize calls once held 550 MB for an hour.
const (
	DefaultMaxSessions         = 1024
	DefaultMaxSessionsPerToken = 256
	// DefaultSessionIdle closes a session that sent no request for this long, and its pusher.
	// A client whose session was closed gets a 404 and opens a new one, as the MCP spec asks.
	DefaultSessionIdle = 30 * time.Minute
)

// SessionLimits bound the MCP sessions open over HTTP: all of them, those opened with one
// token, and how long one may stay idle. Zero fields take the defaults.
type SessionLimits struct {
	Max, PerToken int
	Idle          time.Duration
}

func (l SessionLimits) withDefaults() SessionLimits {
	if l.Max <= 0 {
		l.Max = DefaultMaxSessions
	}
	if l.PerToken <= 0 {
		l.PerToken = DefaultMaxSessionsPerToken
	}
	if l.Idle <= 0 {
		l.Idle = DefaultSessionIdle
	}
	return l
}

// HTTP serves the MCP tools over streamable HTTP, mounted at the coordinator's /mcp behind the
// API's authentication. Each MCP session's tools call the API in-process: a client.Client whose
// transport hands each request to the API's own handler with the caller's token and session, so
// that a call through /mcp passes the same authentication, bounds and validation as one through
// /v1, with no socket and no TLS between the two.
type HTTP struct {
	host *Host
	mcp  *sdk.StreamableHTTPHandler
	// API is the API's handler (httpapi.Server.Handler). It is set after the httpapi server is
	// made, since that server mounts this handler, and before it serves.
	API    http.Handler
	limits SessionLimits

	mu       sync.Mutex
	sessions int            // open, or being opened
	perToken map[string]int // sessions by the token that opened them
}

// NewHTTP returns the handler of /mcp. maxBody bounds a request's body as the API bounds its own
// (httpapi.MaxBodyBytes): the API's checks have bounded it already, and the SDK reads it again.
func NewHTTP(ctx context.Context, cfg Config, limits SessionLimits, maxBody int64) *HTTP {
	m := &HTTP{host: NewHost(ctx, cfg), limits: limits.withDefaults(), perToken: map[string]int{}}
	m.mcp = sdk.NewStreamableHTTPHandler(m.sessionServer, &sdk.StreamableHTTPOptions{
		SessionTimeout:      m.limits.Idle,
		MaxRequestBodyBytes: maxBody,
		// The API's Host and Origin checks guard /mcp as they guard /v1: one place decides.
		DisableLocalhostProtection: true,
	})
	return m
}

// Close ends the sessions' pushers and waits for them.
func (m *HTTP) Close() { m.host.Close() }

// bearer is the request's bearer token, "" without one.
func bearer(r *http.Request) string {
	if token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return token
	}
	return ""
}

// server returns the MCP server of a new session: its client carries the token and the session
// (header Sbx-Session, else the API's default) of the request that opened it.
func (m *HTTP) server(r *http.Request) *sdk.Server {
	c := client.New("http://"+r.Host, bearer(r))
	c.HTTPClient = &http.Client{Transport: &handlerTransport{handler: m.API, remoteAddr: r.RemoteAddr}}
	c.Session = r.Header.Get("Sbx-Session")
	return m.host.server(c, nil)
}

// newSessionServer carries, in a request's context, the server ServeHTTP made for the session the
// request opens.
type newSessionServer struct{}

// sessionServer is the SDK's getServer: the server ServeHTTP made for a request that opens a
// session, nil for any other request (the SDK then checks the protocol version against its own
// list, which the servers do not narrow).
func (m *HTTP) sessionServer(r *http.Request) *sdk.Server {
	s, _ := r.Context().Value(newSessionServer{}).(*sdk.Server)
	return s
}

// ServeHTTP serves the MCP endpoint. It is mounted behind the API's checks (httpapi.Config.Handlers),
// which have read and bounded a POST's body already (size, time, JSON).
//
// A POST without Mcp-Session-Id opens a session: it is refused (503) past the bounds of
// SessionLimits, and the session counts against them until it closes (the client's DELETE,
// the idle timeout, the coordinator stopping).
func (m *HTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.Header.Get("Mcp-Session-Id") != "" {
		m.mcp.ServeHTTP(w, r)
		return
	}
	token := bearer(r)
	if why := m.take(token); why != "" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": "mcp_sessions_full", "message": why}})
		return
	}
	srv := m.server(r)
	m.mcp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), newSessionServer{}, srv)))
	var ss *sdk.ServerSession
	for s := range srv.Sessions() {
		ss = s
	}
	if ss == nil {
		m.release(token) // the request opened no session (it failed, or was not an initialize)
		return
	}
	m.host.wg.Go(func() {
		defer m.release(token)
		stop := context.AfterFunc(m.host.ctx, func() { ss.Close() })
		defer stop()
		_ = ss.Wait()
	})
}

// take counts a session opened with token, or says why it may not open.
func (m *HTTP) take(token string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.sessions >= m.limits.Max:
		return fmt.Sprintf("The coordinator has %d MCP sessions open, the most it keeps (--mcp-max-sessions); close unused ones (DELETE /mcp) or try again later.", m.sessions)
	case m.perToken[token] >= m.limits.PerToken:
		return fmt.Sprintf("This token has %d MCP sessions open, the most one token keeps (--mcp-max-sessions-per-token); close unused ones (DELETE /mcp), or wait for idle ones to expire (%s).", m.perToken[token], m.limits.Idle)
	}
	m.sessions++
	m.perToken[token]++
	return ""
}

func (m *HTTP) release(token string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sessions--
	if m.perToken[token]--; m.perToken[token] <= 0 {
		delete(m.perToken, token)
	}
}

// open returns the number of sessions open.
func (m *HTTP) open() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sessions
}

// handlerTransport is an http.RoundTripper that serves each request with an in-process handler
// and returns the whole reply. It suits the calls the MCP tools make, whose replies are bounded;
// it does not stream.
type handlerTransport struct {
	handler    http.Handler
	remoteAddr string
}

func (t *handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	in := req.Clone(req.Context())
	in.RequestURI = req.URL.RequestURI()
	in.RemoteAddr = t.remoteAddr
	if in.Host == "" {
		in.Host = req.URL.Host
	}
	if in.Body == nil {
		in.Body = http.NoBody
	}
	rec := &recorder{header: http.Header{}}
	t.handler.ServeHTTP(rec, in)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return &http.Response{
		Status: http.StatusText(rec.status), StatusCode: rec.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: rec.header, Body: io.NopCloser(&rec.body), ContentLength: int64(rec.body.Len()),
		Request: req,
	}, nil
}

// recorder is the http.ResponseWriter of handlerTransport.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(p)
}
