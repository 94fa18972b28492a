package mcp

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// legacyProtocol is the protocol version Claude Code and Cursor speak: a session opened by
// initialize.
const legacyProtocol = "2025-11-25"

// initializeMCP opens an MCP session at url with token, as a client's first POST does, and returns
// the reply's status and the session's id.
func initializeMCP(t *testing.T, url, token string) (int, string) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + legacyProtocol + `","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	req, _ := http.NewRequestWithContext(t.Context(), "POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Mcp-Session-Id")
}

// waitOpen polls until m has want sessions open.
func waitOpen(t *testing.T, m *HTTP, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for m.open() != want {
		if time.Now().After(deadline) {
			t.Fatalf("%d MCP sessions open, want %d", m.open(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMCPSessionsBounded: /mcp opens at most so many sessions, in all and per token, and a closed
// or idle session gives its place back. 10,000 initialize calls once held 550 MB for an hour.
func TestMCPSessionsBounded(t *testing.T) {
	open := func(t *testing.T, limits SessionLimits) (*HTTP, string) {
		m := NewHTTP(context.Background(), Config{}, limits, 1<<20)
		t.Cleanup(m.Close)
		srv := httptest.NewServer(m) // initialize calls nothing of the API
		t.Cleanup(srv.Close)
		return m, srv.URL
	}
	count := func(t *testing.T, url, token string, n int) (ids []string) {
		for range n {
			status, id := initializeMCP(t, url, token)
			switch {
			case status == http.StatusOK && id != "":
				ids = append(ids, id)
			case status != http.StatusServiceUnavailable:
				t.Fatalf("initialize: status %d, want 200 or 503", status)
			}
		}
		return ids
	}

	t.Run("caps", func(t *testing.T) {
		m, url := open(t, SessionLimits{Max: 20, PerToken: 10, Idle: time.Hour})
		a := count(t, url, "a", 50)
		if len(a) != 10 {
			t.Fatalf("%d of 50 sessions opened with one token, want 10", len(a))
		}
		if b := count(t, url, "b", 50); len(b) != 10 {
			t.Fatalf("%d of 50 sessions opened with a second token, want 10", len(b))
		}
		if c := count(t, url, "c", 5); len(c) != 0 {
			t.Fatalf("%d sessions opened past the total of 20", len(c))
		}
		// A closed session gives its place back.
		req, _ := http.NewRequest("DELETE", url, nil)
		req.Header.Set("Mcp-Session-Id", a[0])
		req.Header.Set("Authorization", "Bearer a")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("DELETE: status %d", resp.StatusCode)
		}
		waitOpen(t, m, 19)
		if c := count(t, url, "c", 1); len(c) != 1 {
			t.Fatal("no session opens after one was closed")
		}
	})

	t.Run("idle", func(t *testing.T) {
		m, url := open(t, SessionLimits{Max: 20, PerToken: 10, Idle: 200 * time.Millisecond})
		if a := count(t, url, "a", 10); len(a) != 10 {
			t.Fatalf("%d sessions opened, want 10", len(a))
		}
		waitOpen(t, m, 0) // idle sessions expire
		if a := count(t, url, "a", 1); len(a) != 1 {
			t.Fatal("no session opens after the idle ones expired")
		}
	})
}
