package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/coordinator/httpapi"
)

// mcpSessionTimeout closes an HTTP MCP session that sent no request for this long, and its pusher.
// A client whose session was closed gets a 404 and opens a new one, as the MCP spec asks.
const mcpSessionTimeout = time.Hour

// mcpHTTP serves the MCP tools over streamable HTTP, mounted at the coordinator's /mcp behind the
// API's authentication. Each MCP session's tools call the API in-process: a client.Client whose
// transport hands each request to the API's own handler with the caller's token and session, so
// that a call through /mcp passes the same authentication, bounds and validation as one through
// /v1, with no socket and no TLS between the two.
type mcpHTTP struct {
	host *mcpHost
	mcp  *mcp.StreamableHTTPHandler
	// API is the API's handler (httpapi.Server.Handler). It is set after the httpapi server is
	// made, since that server mounts this handler, and before it serves.
	API http.Handler
}

func newMCPHTTP(ctx context.Context, cfg mcpConfig) *mcpHTTP {
	m := &mcpHTTP{host: newMCPHost(ctx, cfg)}
	m.mcp = mcp.NewStreamableHTTPHandler(m.server, &mcp.StreamableHTTPOptions{
		SessionTimeout:      mcpSessionTimeout,
		MaxRequestBodyBytes: httpapi.MaxBodyBytes,
		// The API's Host and Origin checks guard /mcp as they guard /v1: one place decides.
		DisableLocalhostProtection: true,
	})
	return m
}

// close ends the sessions' pushers and waits for them.
func (m *mcpHTTP) close() { m.host.close() }

// server returns the MCP server of a new session: its client carries the token and the session
// (header Sbx-Session, else the API's default) of the request that opened it.
func (m *mcpHTTP) server(r *http.Request) *mcp.Server {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		token = ""
	}
	c := client.New("http://"+r.Host, token)
	c.HTTPClient = &http.Client{Transport: &handlerTransport{handler: m.API, remoteAddr: r.RemoteAddr}}
	c.Session = r.Header.Get("Sbx-Session")
	return m.host.server(c, nil)
}

// ServeHTTP serves the MCP endpoint. It is mounted behind the API's checks (httpapi.Config.Handlers),
// which have read and bounded a POST's body already (size, time, JSON).
func (m *mcpHTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.mcp.ServeHTTP(w, r)
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
