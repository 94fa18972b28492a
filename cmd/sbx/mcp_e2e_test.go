package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbx-dev/sbx/coordinator/client"
	sbxmcp "github.com/sbx-dev/sbx/coordinator/mcp"
)

// testMCPStdio drives the sbx binary's `sbx mcp` over stdio as Claude Code would: a client that
// declares Claude Code's channel capability, so that notifications come as channel events too.
func testMCPStdio(t *testing.T, addr, token, cwd string) {
	bin := buildSbx(t)
	cmd := exec.Command(bin, "mcp", "--session", "stdio", "--max-block", "2s")
	cmd.Env = append(os.Environ(), "SBX_ADDR="+addr, "SBX_TOKEN="+token)
	cmd.Dir = cwd
	cmd.Stderr = os.Stderr
	channel := make(chan *jsonrpc.Request, 16)
	mc, m := newMCPClient(&mcp.ClientCapabilities{Experimental: map[string]any{sbxmcp.ClaudeChannel: map[string]any{}}})
	cs, err := mc.Connect(t.Context(), &channelSpy{Transport: &mcp.CommandTransport{Command: cmd}, events: channel}, &mcp.ClientSessionOptions{ProtocolVersion: mcpLegacy})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	m.ClientSession = cs
	if _, ok := cs.InitializeResult().Capabilities.Experimental[sbxmcp.ClaudeChannel]; !ok {
		t.Errorf("sbx mcp does not declare %s", sbxmcp.ClaudeChannel)
	}
	n := driveMCP(t, m, 2*time.Second)
	select {
	case e := <-channel:
		var p struct {
			Content string            `json:"content"`
			Meta    map[string]string `json:"meta"`
		}
		if err := json.Unmarshal(e.Params, &p); err != nil {
			t.Fatal(err)
		}
		if p.Content != n.Text || p.Meta["job_id"] != n.JobID || p.Meta["seq"] != fmt.Sprint(n.Seq) || p.Meta["status"] != "error" {
			t.Errorf("channel event %s, want the notification %+v", e.Params, n)
		}
	case <-time.After(10 * time.Second):
		t.Error("no channel event")
	}
}

// testMCPHTTP drives the coordinator's /mcp over streamable HTTP, with the API's token.
func testMCPHTTP(t *testing.T, addr, token, cwd string) {
	endpoint := addr + "/mcp"
	// The token is required, as on /v1.
	resp, err := http.Post(endpoint, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST /mcp without the token: %s", resp.Status)
	}
	// A message is bounded as a /v1 body is.
	req, _ := http.NewRequest("POST", endpoint, bytes.NewReader(make([]byte, 2<<20)))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("POST /mcp of 2 MiB: %s", resp.Status)
	}

	hc := &http.Client{Transport: &headers{base: http.DefaultTransport, set: map[string]string{
		"Authorization": "Bearer " + token, "Sbx-Session": "http",
	}}}
	mc, m := newMCPClient(nil)
	cs, err := mc.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: mcpLegacy})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	m.ClientSession = cs
	// The session is the Sbx-Session header's; run has no default directory over HTTP.
	if _, _, err := callTool[any](t.Context(), cs, "run", map[string]any{"command": "true"}, nil); err == nil || !strings.Contains(err.Error(), "cwd is required") {
		t.Errorf("run without cwd over HTTP: %v", err)
	}
	n := driveMCP(t, m, 2*time.Second, "cwd", cwd)
	if n.Session != "http" {
		t.Errorf("session %q, want the Sbx-Session header's", n.Session)
	}

	// A client without the GET stream cannot receive pushes; its session goes on regardless.
	mc, m = newMCPClient(nil)
	quiet, err := mc.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, DisableStandaloneSSE: true}, &mcp.ClientSessionOptions{ProtocolVersion: mcpLegacy})
	if err != nil {
		t.Fatal(err)
	}
	defer quiet.Close()
	if err := quiet.SetLoggingLevel(t.Context(), &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatal(err)
	}
	_, res := call[sbxmcp.JobResult](t, quiet, "run", map[string]any{"command": "exit 1", "cwd": cwd})
	_, page := call[client.Notifications](t, quiet, "notifications", map[string]any{"wait_ms": 10000})
	if len(page.Notifications) != 1 || page.Notifications[0].JobID != res.Job.ID {
		t.Fatalf("notifications: %+v", page)
	}
	time.Sleep(100 * time.Millisecond) // the push was tried
	if _, page = call[client.Notifications](t, quiet, "notifications", nil); len(page.Notifications) != 1 {
		t.Errorf("notifications after a failed push: %+v", page)
	}
	call[any](t, quiet, "ack", map[string]any{"seq": page.Next})
}

// testMCPDefaultProtocol connects the SDK's client as it comes, at its default protocol version
// (2026-07-28, which opens no session), to `sbx mcp` over stdio and to /mcp, and sees a job's end
// pushed on both.
func testMCPDefaultProtocol(t *testing.T, addr, token, cwd string) {
	bin := buildSbx(t)
	hc := &http.Client{Transport: &headers{base: http.DefaultTransport, set: map[string]string{
		"Authorization": "Bearer " + token, "Sbx-Session": "default-http",
	}}}
	for _, tc := range []struct {
		name string
		t    func() mcp.Transport
	}{
		{"stdio", func() mcp.Transport {
			cmd := exec.Command(bin, "mcp", "--session", "default-stdio")
			cmd.Env = append(os.Environ(), "SBX_ADDR="+addr, "SBX_TOKEN="+token)
			cmd.Dir = cwd
			cmd.Stderr = os.Stderr
			return &mcp.CommandTransport{Command: cmd}
		}},
		{"http", func() mcp.Transport { return &mcp.StreamableClientTransport{Endpoint: addr + "/mcp", HTTPClient: hc} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mc, m := newMCPClient(nil)
			cs, err := mc.Connect(t.Context(), tc.t(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			if v := cs.InitializeResult().ProtocolVersion; v >= sbxmcp.StatelessVersion {
				t.Errorf("session at protocol %s: no push can reach it", v)
			}
			if err := cs.SetLoggingLevel(t.Context(), &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
				t.Fatal(err)
			}
			_, res := call[sbxmcp.JobResult](t, cs, "run", map[string]any{"command": "exit 3", "cwd": cwd})
			n := nextPush(t, m.logs, res.Job.ID)
			if n.Status != "error" || !strings.Contains(n.Text, "detail: exit_code=3") {
				t.Errorf("pushed: %+v", n)
			}
			call[any](t, cs, "ack", map[string]any{"seq": n.Seq})
		})
	}
}

// driveMCP walks through what an agent does with a dev server: start it in the background, wait
// for the line that says it is up, read its output, wait past the bound of one call, kill it, and
// get the pushed notification of its end. extra are more arguments of run. It returns the pushed
// notification.
func driveMCP(t *testing.T, m *mcpClient, maxBlock time.Duration, extra ...string) client.Notification {
	t.Helper()
	cs := m.ClientSession
	if err := cs.SetLoggingLevel(t.Context(), &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatal(err)
	}
	args := map[string]any{"command": "echo starting; sleep 0.5; echo listening on 8080; sleep 60", "title": "dev server"}
	for i := 0; i+1 < len(extra); i += 2 {
		args[extra[i]] = extra[i+1]
	}
	text, res := call[sbxmcp.JobResult](t, cs, "run", args)
	id := res.Job.ID
	if res.Done || !strings.Contains(text, "Started in the background") {
		t.Fatalf("run: %s", text)
	}
	text, res = call[sbxmcp.JobResult](t, cs, "wait", map[string]any{"id": id, "pattern": "^listening on", "timeout_ms": 20000})
	if !res.PatternMatched || res.Done || !strings.Contains(res.Output, "listening on 8080\n") || res.Matched == nil || *res.Matched != "listening on" ||
		!strings.Contains(text, `matched "listening on" at byte 9`) {
		t.Fatalf("wait for the pattern: %s", text)
	}
	if _, page := call[sbxmcp.OutputResult](t, cs, "output", map[string]any{"id": id}); page.Output != "starting\nlistening on 8080\n" {
		t.Errorf("output: %q", page.Output)
	}
	// A wait longer than one call may block comes back before the client's timeout, with the
	// call that goes on waiting.
	begin := time.Now()
	_, res = call[sbxmcp.JobResult](t, cs, "wait", map[string]any{"id": id, "timeout_ms": 120000, "offset": res.OutputEnd})
	if took := time.Since(begin); took > maxBlock+3*time.Second || res.Done || res.Next == nil || res.Next.Arguments["id"] != id {
		t.Errorf("long wait took %s: %+v", took, res)
	}
	// The agent's own kill is observed: no notification follows it. A job that fails on its own
	// is pushed.
	call[any](t, cs, "kill", map[string]any{"id": id})
	failing := map[string]any{"command": "sleep 0.3; exit 3", "title": "fails"}
	for i := 0; i+1 < len(extra); i += 2 {
		failing[extra[i]] = extra[i+1]
	}
	_, res = call[sbxmcp.JobResult](t, cs, "run", failing)
	n := nextPush(t, m.logs, res.Job.ID)
	if n.Status != "error" || !strings.Contains(n.Text, "task_id: "+res.Job.ID) {
		t.Errorf("pushed: %+v", n)
	}
	if _, page := call[client.Notifications](t, cs, "notifications", nil); len(page.Notifications) != 1 || page.Notifications[0].JobID != res.Job.ID {
		t.Errorf("notifications after a kill and a failure: %+v", page)
	}
	call[any](t, cs, "ack", map[string]any{"seq": n.Seq})
	return n
}

// channelSpy is a client transport that takes Claude Code channel events off the connection.
type channelSpy struct {
	mcp.Transport
	events chan<- *jsonrpc.Request
}

func (s *channelSpy) Connect(ctx context.Context) (mcp.Connection, error) {
	conn, err := s.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &channelSpyConn{Connection: conn, events: s.events}, nil
}

type channelSpyConn struct {
	mcp.Connection
	events chan<- *jsonrpc.Request
}

func (c *channelSpyConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	for {
		msg, err := c.Connection.Read(ctx)
		if r, ok := msg.(*jsonrpc.Request); ok && err == nil && r.Method == "notifications/claude/channel" {
			select {
			case c.events <- r:
			default:
			}
			continue
		}
		return msg, err
	}
}

// headers sets request headers on every request.
type headers struct {
	base http.RoundTripper
	set  map[string]string
}

func (h *headers) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, v := range h.set {
		req.Header.Set(k, v)
	}
	return h.base.RoundTrip(req)
}
