// Package client is the Go client of sbx's HTTP API (see docs/api.md). Its wire types are package api's,
// which the server encodes too, so that it depends on the API and not on the server's code.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"

	"github.com/sbx-dev/sbx/coordinator/api"
)

// Bounds of what the client reads.
const (
	// maxReplyBytes bounds a JSON reply: a listing of 1000 jobs with 64 KiB commands fits.
	maxReplyBytes = 128 << 20
	// maxErrorBytes bounds an error reply.
	maxErrorBytes = 64 << 10
)

// Client calls a coordinator: one address, or several of one fleet, tried in turn. Its methods
// are safe for concurrent use.
type Client struct {
	addrs []string
	// cur is the index in addrs of the address that last answered: the next request tries it
	// first, so a dead coordinator costs one refused connection, not one per request.
	cur   atomic.Int32
	token string
	// HTTPClient sends the requests. The default has no timeout because waits and output streams
	// last as long as asked: bound each call with its context.
	HTTPClient *http.Client
	// Session, when set, is sent as the Sbx-Session header: the session of jobs started without one.
	Session string
}

// DefaultAddr is the coordinator's address when SBX_ADDR is not set.
const DefaultAddr = "http://127.0.0.1:7070"

// New returns a client of the coordinator at addr ("http://127.0.0.1:7070", or https://). token,
// when not empty, is sent as "Authorization: Bearer token". The client follows no redirect: the
// API never sends one, and following one could take a request to another route or host.
func New(addr, token string) *Client {
	return NewFleet([]string{addr}, token)
}

// NewFleet is New for the coordinators of one fleet: a request whose connection cannot be made to
// one address goes to the next (see sendHeader). addr is not split on commas, so that an address
// taken from a request (a Host header) stays one address.
func NewFleet(addrs []string, token string) *Client {
	c := &Client{token: token, HTTPClient: &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	for _, a := range addrs {
		c.addrs = append(c.addrs, strings.TrimRight(a, "/"))
	}
	return c
}

// FromEnv returns a client configured the way every sbx client command is: SBX_ADDR (default
// DefaultAddr; a comma-separated list for a fleet), SBX_TOKEN, and SBX_CA_FILE, a PEM file of
// the certificates to trust for an https address besides the system's (for a self-signed
// coordinator).
func FromEnv(getenv func(string) string) (*Client, error) {
	addr := getenv("SBX_ADDR")
	if addr == "" {
		addr = DefaultAddr
	}
	var addrs []string
	for _, a := range strings.Split(addr, ",") {
		a = strings.TrimSpace(a)
		if u, err := url.Parse(a); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("SBX_ADDR %q is not an http:// or https:// address", a)
		}
		addrs = append(addrs, a)
	}
	c := NewFleet(addrs, getenv("SBX_TOKEN"))
	if path := getenv("SBX_CA_FILE"); path != "" {
		pool, err := certPool(path)
		if err != nil {
			return nil, fmt.Errorf("SBX_CA_FILE: %w", err)
		}
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		c.HTTPClient.Transport = t
	}
	return c, nil
}

// certPool is the system's certificates and those of the PEM file at path.
func certPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool() // no system pool: the file's certificates only
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New(path + " holds no PEM certificate")
	}
	return pool, nil
}

// JobPath is the path of a job ("/v1/jobs/{id}") followed by suffix ("/wait?timeout_ms=0").
func JobPath(id, suffix string) string { return api.JobPath(id) + suffix }

// SessionPath is the path of a session ("/v1/sessions/{id}") followed by suffix ("/renew").
func SessionPath(id, suffix string) string { return api.SessionPath(id) + suffix }

// Error is an error reply of the API.
type Error struct {
	Status  int    // HTTP status
	Code    string // "invalid", "not_found", "conflict", ... (docs/api.md)
	Message string // one clear sentence
}

func (e *Error) Error() string { return e.Message + " (" + e.Code + ")" }

// Do sends a request and returns the body of a 2xx reply as it is: the API's JSON, for callers that
// print it (--json). path is the part after the address, query included ("/v1/jobs?limit=5"). body
// is sent as JSON; a []byte or json.RawMessage is sent as it is; nil sends no body. An error reply
// is returned as an *Error.
func (c *Client) Do(ctx context.Context, method, path string, body any) ([]byte, error) {
	return c.doHeader(ctx, method, path, body, nil)
}

// doHeader is Do with extra headers.
func (c *Client) doHeader(ctx context.Context, method, path string, body any, hdr http.Header) ([]byte, error) {
	resp, err := c.sendHeader(ctx, method, path, body, hdr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read reply: %w", method, path, err)
	}
	if len(data) > maxReplyBytes {
		return nil, fmt.Errorf("%s %s: reply larger than %d bytes", method, path, maxReplyBytes)
	}
	return data, nil
}

// call is Do followed by decoding the reply into out.
func (c *Client) call(ctx context.Context, method, path string, body, out any) error {
	data, err := c.Do(ctx, method, path, body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode reply: %w", method, path, err)
	}
	return nil
}

// send sends a request and returns a 2xx response, whose body the caller closes; any other status
// becomes an *Error.
func (c *Client) send(ctx context.Context, method, path string, body any) (*http.Response, error) {
	return c.sendHeader(ctx, method, path, body, nil)
}

// sendHeader is send with extra headers. A request whose connection cannot be made (refused,
// no route, DNS) goes to the next address of the list, from the one that last answered: nothing
// of it reached a server, so trying it elsewhere cannot run it twice. An error after the
// connection was made, and an error reply, are returned as they are: the server may have acted.
func (c *Client) sendHeader(ctx context.Context, method, path string, body any, hdr http.Header) (*http.Response, error) {
	var data []byte
	switch b := body.(type) {
	case nil:
	case []byte:
		data = b
	case json.RawMessage:
		data = b
	default:
		var err error
		if data, err = json.Marshal(b); err != nil {
			return nil, fmt.Errorf("%s %s: encode body: %w", method, path, err)
		}
	}
	first := int(c.cur.Load())
	var err error
	for i := range c.addrs {
		n := (first + i) % len(c.addrs)
		var resp *http.Response
		resp, err = c.sendTo(ctx, c.addrs[n], method, path, body != nil, data, hdr)
		if err != nil && dialFailed(err) && ctx.Err() == nil {
			continue
		}
		c.cur.Store(int32(n))
		return resp, err
	}
	return nil, err
}

// dialFailed tells whether err is a failure to make the connection, before any byte was sent.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// sendTo sends one request to addr.
func (c *Client) sendTo(ctx context.Context, addr, method, path string, hasBody bool, data []byte, hdr http.Header) (*http.Response, error) {
	var r io.Reader
	if hasBody {
		r = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, addr+path, r)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if r != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.Session != "" {
		req.Header.Set(api.HeaderSession, c.Session)
	}
	resp, err := c.HTTPClient.Do(req)
	if err != nil {
		return nil, err // already names the method and URL
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, decodeError(resp)
}

// decodeError turns an error reply into an *Error. A reply that is not the API's error shape (a
// proxy's page, say) keeps its status and the start of its body.
func decodeError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBytes))
	var e api.ErrorReply
	if json.Unmarshal(data, &e) == nil && e.Error.Code != "" {
		return &Error{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
	}
	msg := strings.TrimSpace(string(data))
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	return &Error{Status: resp.StatusCode, Code: "http_" + fmt.Sprint(resp.StatusCode), Message: msg}
}
