package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbx-dev/sbx/coordinator/client"
	sbxmcp "github.com/sbx-dev/sbx/coordinator/mcp"
)

// TestScopedTokenEndToEnd: `sbx token create --sessions PREFIX` makes a token that a real sbx serve
// holds to those sessions, through the CLI and through /mcp, while the coordinator's token still
// reaches everything.
func TestScopedTokenEndToEnd(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("main-token-of-the-coordinator\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, "--token-file", tokenFile)
	ctx := t.Context()
	var out bytes.Buffer
	if err := run(ctx, []string{"token", "create", "--sessions", "agent1-", "--token-file", tokenFile}, os.Getenv, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	scoped := strings.TrimSpace(out.String())
	if err := run(ctx, []string{"token", "create", "--sessions", "a/b", "--token-file", tokenFile}, os.Getenv, io.Discard, io.Discard); code(err) != 2 {
		t.Errorf("a prefix that is no session prefix: exit %d, want 2", code(err))
	}

	main := client.New(s.addr, "main-token-of-the-coordinator")
	main.Session = "other"
	cwd := jobDir(t) // jobs run as sbx-job: a directory it may enter
	started, err := main.Start(ctx, client.StartRequest{Command: "sleep 100", Cwd: cwd})
	if err != nil {
		t.Fatal(err)
	}
	other := started.Job.ID
	t.Cleanup(func() { main.Kill(t.Context(), other, "KILL") })

	// The CLI with the scoped token: another session's job is not there.
	getenv := func(k string) string {
		switch k {
		case "SBX_ADDR":
			return s.addr
		case "SBX_TOKEN":
			return scoped
		}
		return ""
	}
	var stderr bytes.Buffer
	if err := run(ctx, []string{"kill", other}, getenv, io.Discard, &stderr); err == nil {
		t.Error("sbx kill with a scoped token stopped another session's job")
	}
	if err := run(ctx, []string{"end-session", "other"}, getenv, io.Discard, &stderr); err == nil {
		t.Error("sbx end-session with a scoped token ended another session")
	}

	// /mcp with the scoped token: the tools reach its sessions only.
	hc := &http.Client{Transport: &headers{base: http.DefaultTransport, set: map[string]string{"Authorization": "Bearer " + scoped}}}
	mc, _ := newMCPClient(nil)
	cs, err := mc.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.addr + "/mcp", HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: mcpLegacy})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, _, err := callTool[any](ctx, cs, "kill", map[string]any{"id": other}, nil); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("MCP kill of another session's job: %v", err)
	}
	if _, _, err := callTool[any](ctx, cs, "end_session", map[string]any{"session": "other"}, nil); err == nil || !strings.Contains(err.Error(), "agent1-") {
		t.Errorf("MCP end_session of another session: %v", err)
	}
	_, res := call[sbxmcp.JobResult](t, cs, "run", map[string]any{"command": "true", "cwd": cwd, "block_until_ms": 20000})
	if res.Job.Session != "agent1-" || !res.Done {
		t.Errorf("MCP run with a scoped token: session %q, done %v", res.Job.Session, res.Done)
	}
	text, _ := call[any](t, cs, "list", map[string]any{})
	if strings.Contains(text, other) || !strings.Contains(text, res.Job.ID) {
		t.Errorf("MCP list with a scoped token:\n%s", text)
	}

	// The coordinator's token is not limited.
	if j, err := main.Job(ctx, other); err != nil || j.Status != client.StatusRunning {
		t.Errorf("the main token: %+v, %v", j, err)
	}
}

// TestBoundFlags: the bounds' flags refuse nonsense with a usage error (exit 2) before anything
// starts.
func TestBoundFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--max-conns", "0"},
		{"--max-conns-per-client", "-1"},
		{"--mcp-max-sessions", "0"},
		{"--mcp-max-sessions-per-token", "0"},
		{"--mcp-session-idle", "0s"},
		{"--output-budget", "5G"}, // not above --retain-bytes (10G)
		{"--output-budget", "lots"},
		{"--min-free-disk", "-1G"},
	} {
		full := append([]string{"coordinator", "--nats", "nats://127.0.0.1:1", "--listen", "127.0.0.1:0", "--data", t.TempDir()}, args...)
		if err := run(t.Context(), full, os.Getenv, io.Discard, io.Discard); code(err) != 2 || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("sbx coordinator %s: exit %d (%v), want 2 naming %s", strings.Join(args, " "), code(err), err, args[0])
		}
	}
}
