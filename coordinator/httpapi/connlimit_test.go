package httpapi_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/httpapi"
	"github.com/sbx-dev/sbx/internal/poll"
)

// openServer serves h's service with cfg on a real loopback listener and returns its address.
func (h *harness) openServer(t *testing.T, cfg httpapi.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := httpapi.NewServer(h.svc, cfg)
	s.Open(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Close(ctx)
	})
	return ln.Addr().String()
}

// keepAlive dials addr from the loopback address from, sends GET path over HTTP/1.1 keep-alive
// and reads the reply. It returns the connection, still open, when the server answered, and nil
// when the server closed it unanswered.
func keepAlive(t *testing.T, addr, from, path string, header ...string) (net.Conn, *http.Response) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", from, err)
	}
	req := "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n"
	for i := 0; i+1 < len(header); i += 2 {
		req += header[i] + ": " + header[i+1] + "\r\n"
	}
	if _, err := c.Write([]byte(req + "\r\n")); err != nil {
		c.Close()
		return nil, nil // closed by the server before the request went out
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("no reply and no close within 10 s: %v", err)
		}
		c.Close()
		return nil, nil
	}
	resp.Body.Close()
	return c, resp
}

// TestConnLimits: connections past the bounds, total and per client address, are closed unanswered,
// and those of other clients are still served; a closed connection gives its slot back. 20,000
// keep-alives once took every file descriptor of the process.
func TestConnLimits(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	open := func(t *testing.T, addr, from string, n int) (served []net.Conn) {
		t.Helper()
		for range n {
			if c, _ := keepAlive(t, addr, from, "/healthz"); c != nil {
				served = append(served, c)
			}
		}
		t.Cleanup(func() {
			for _, c := range served {
				c.Close()
			}
		})
		return served
	}

	t.Run("per client", func(t *testing.T) {
		addr := h.openServer(t, httpapi.Config{MaxConns: 1000, MaxConnsPerClient: 20})
		served := open(t, addr, "127.0.0.1", 50)
		if len(served) != 20 {
			t.Fatalf("%d of 50 connections from one client served, want 20", len(served))
		}
		if got := open(t, addr, "127.0.0.2", 1); len(got) != 1 {
			t.Fatal("another client is refused while the first holds its 20")
		}
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}}
		hc := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
		resp, err := hc.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		hc.CloseIdleConnections()
		if !strings.Contains(string(body), "sbx_http_connections_refused_total 30\n") {
			t.Errorf("the 30 refused connections are not in the metrics:\n%s", body)
		}
		for _, c := range served {
			c.Close()
		}
		// The server frees a slot when it sees the connection closed: poll.
		poll.Until(t, 10*time.Second, "closed connections give their slots back", func() bool {
			return len(open(t, addr, "127.0.0.1", 1)) > 0
		})
	})

	t.Run("total", func(t *testing.T) {
		addr := h.openServer(t, httpapi.Config{MaxConns: 20, MaxConnsPerClient: 1000})
		n := len(open(t, addr, "127.0.0.1", 25)) + len(open(t, addr, "127.0.0.2", 25))
		if n != 20 {
			t.Fatalf("%d of 50 connections served, want 20", n)
		}
		if got := open(t, addr, "127.0.0.3", 1); len(got) != 0 {
			t.Fatal("a 21st connection was served")
		}
	})
}

// TestUnauthenticatedConnectionsClose: with a token, a call without it (a probe, a 401) is
// answered on a connection that then closes; a token holder's connection stays alive.
func TestUnauthenticatedConnectionsClose(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	addr := h.openServer(t, httpapi.Config{Token: "s3cret"})
	for _, path := range []string{"/healthz", "/v1/jobs"} {
		c, resp := keepAlive(t, addr, "127.0.0.1", path)
		if c == nil {
			t.Fatalf("%s: no reply", path)
		}
		defer c.Close()
		if !resp.Close {
			t.Errorf("%s without the token (status %d): the connection is kept alive", path, resp.StatusCode)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Errorf("%s without the token: the server did not close the connection (%d, %v)", path, n, err)
		}
	}
	c, resp := keepAlive(t, addr, "127.0.0.1", "/v1/jobs", "Authorization", "Bearer s3cret")
	if c == nil {
		t.Fatal("no reply with the token")
	}
	defer c.Close()
	if resp.Close || resp.StatusCode != http.StatusOK {
		t.Errorf("with the token: status %d, close %v; want 200 on a kept connection", resp.StatusCode, resp.Close)
	}
}
