package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbx-dev/sbx/coordinator/client"
	sbxmcp "github.com/sbx-dev/sbx/coordinator/mcp"
)

// mcpLegacy is the protocol version Claude Code and Cursor speak: a session opened by initialize,
// which is what push needs.
const mcpLegacy = "2025-11-25"

// mcpClient is an MCP client session and what it was sent besides replies.
type mcpClient struct {
	*mcp.ClientSession
	logs     chan *mcp.LoggingMessageParams
	mu       sync.Mutex
	progress int
}

func (m *mcpClient) progressCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.progress
}

// newMCPClient returns a client that records log messages and progress notifications.
func newMCPClient(caps *mcp.ClientCapabilities) (*mcp.Client, *mcpClient) {
	m := &mcpClient{logs: make(chan *mcp.LoggingMessageParams, 100)}
	c := mcp.NewClient(&mcp.Implementation{Name: "sbx-test", Version: "1"}, &mcp.ClientOptions{
		Capabilities: caps,
		LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
			select {
			case m.logs <- r.Params:
			default:
			}
		},
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
			m.mu.Lock()
			m.progress++
			m.mu.Unlock()
		},
	})
	return c, m
}

// connectMCP serves the MCP tools over in-memory transports to a new client, with c as backend.
func connectMCP(t *testing.T, c *client.Client, cfg sbxmcp.Config) *mcpClient {
	t.Helper()
	ctx := t.Context()
	h := sbxmcp.NewHost(context.Background(), cfg)
	t.Cleanup(h.Close)
	serverT, clientT := mcp.NewInMemoryTransports()
	ss, err := h.Server(c).Connect(ctx, serverT, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	mc, m := newMCPClient(nil)
	cs, err := mc.Connect(ctx, clientT, &mcp.ClientSessionOptions{ProtocolVersion: mcpLegacy})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	m.ClientSession = cs
	return m
}

// call calls a tool and fails the test on a protocol or tool error.
func call[Out any](t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (string, Out) {
	t.Helper()
	text, out, err := callTool[Out](t.Context(), cs, name, args, nil)
	if err != nil {
		t.Fatalf("%s %v: %v", name, args, err)
	}
	return text, out
}

// callTool calls a tool with an optional progress token and returns its text and structured
// result; a tool error is an error.
func callTool[Out any](ctx context.Context, cs *mcp.ClientSession, name string, args map[string]any, progressToken any) (string, Out, error) {
	var out Out
	p := &mcp.CallToolParams{Name: name, Arguments: args}
	if progressToken != nil {
		p.SetProgressToken(progressToken)
	}
	res, err := cs.CallTool(ctx, p)
	if err != nil {
		return "", out, err
	}
	var text string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text += tc.Text
		}
	}
	if res.IsError {
		return text, out, &toolError{text}
	}
	if res.StructuredContent != nil {
		data, err := json.Marshal(res.StructuredContent)
		if err != nil {
			return text, out, err
		}
		if err := json.Unmarshal(data, &out); err != nil {
			return text, out, err
		}
	}
	return text, out, nil
}

type toolError struct{ text string }

func (e *toolError) Error() string { return "tool error: " + e.text }

// TestMCP drives the MCP tools as an agent's harness would, over in-memory transports, then
// through the sbx binary on stdio and through the coordinator's /mcp, all against one sbx serve.
func TestMCP(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("mcp-test-token-mcp-test-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, "--token-file", tokenFile, "--mcp-max-block", "2s")
	backend := func(session string) *client.Client {
		c := client.New(s.addr, "mcp-test-token-mcp-test-token")
		c.Session = session
		return c
	}
	cwd := jobDir(t)

	t.Run("tools", func(t *testing.T) {
		m := connectMCP(t, backend("tools"), sbxmcp.Config{Cwd: cwd})
		testMCPTools(t, m.ClientSession)
	})
	t.Run("limits", func(t *testing.T) {
		m := connectMCP(t, backend("limits"), sbxmcp.Config{Cwd: cwd})
		// Any subset of the limits is accepted: here, only a timeout.
		_, res := call[sbxmcp.JobResult](t, m.ClientSession, "run", map[string]any{
			"command": "true", "limits": map[string]any{"timeout_ms": 60000}, "block_until_ms": 20000,
		})
		if !res.Done || res.Job.Status != client.StatusSucceeded || res.Job.Limits.TimeoutMS != 60000 || res.Job.Limits.Pids != 0 {
			t.Fatalf("run with limits {timeout_ms}: %+v", res.Job)
		}
		// A job that cannot start says why.
		text, res := call[sbxmcp.JobResult](t, m.ClientSession, "run", map[string]any{"command": "true", "pool": "nowhere"})
		if res.Job.Status != client.StatusQueued || !strings.Contains(text, ": queued (No runner of pool nowhere") {
			t.Errorf("queued job: %s", text)
		}
		call[any](t, m.ClientSession, "kill", map[string]any{"id": res.Job.ID})
	})
	t.Run("input", func(t *testing.T) {
		m := connectMCP(t, backend("input"), sbxmcp.Config{Cwd: cwd})
		cs := m.ClientSession
		_, res := call[sbxmcp.JobResult](t, cs, "run", map[string]any{"command": `read -r a; echo "got $a from $0"`, "stdin": true, "shell": "sh"})
		if res.Job.Shell != "sh" || !res.Job.Stdin {
			t.Fatalf("run with stdin and shell: %+v", res.Job)
		}
		text, _ := call[any](t, cs, "send", map[string]any{"id": res.Job.ID, "text": "yes\n"})
		if !strings.Contains(text, "Wrote 4 bytes") {
			t.Errorf("send: %s", text)
		}
		if _, res = call[sbxmcp.JobResult](t, cs, "wait", map[string]any{"id": res.Job.ID, "timeout_ms": 20000}); !res.Done || res.Output != "got yes from sh\n" {
			t.Errorf("after send: %+v", res)
		}
		if _, _, err := callTool[any](t.Context(), cs, "send", map[string]any{"id": res.Job.ID, "text": "more\n"}, nil); err == nil || !strings.Contains(err.Error(), "conflict") {
			t.Errorf("send to an ended job: %v", err)
		}
	})
	t.Run("tty and port", func(t *testing.T) {
		m := connectMCP(t, backend("tty"), sbxmcp.Config{Cwd: cwd})
		cs := m.ClientSession
		_, res := call[sbxmcp.JobResult](t, cs, "run", map[string]any{"command": `read -p 'Continue? (y/n) ' x; echo got=$x`, "tty": true})
		if !res.Job.TTY {
			t.Fatalf("run with tty: %+v", res.Job)
		}
		if _, w := call[sbxmcp.JobResult](t, cs, "wait", map[string]any{"id": res.Job.ID, "pattern": `\(y/n\) $`, "timeout_ms": 20000}); !w.PatternMatched {
			t.Fatalf("the prompt: %+v", w)
		}
		call[any](t, cs, "send", map[string]any{"id": res.Job.ID, "text": "y\n"})
		if _, w := call[sbxmcp.JobResult](t, cs, "wait", map[string]any{"id": res.Job.ID, "timeout_ms": 20000}); !w.Done || !strings.Contains(w.Output, "got=y\r\n") {
			t.Fatalf("after send: %+v", w)
		}
		_, res = call[sbxmcp.JobResult](t, cs, "run", map[string]any{"command": "exec python3 -m http.server 0 --bind 127.0.0.1"})
		text, w := call[sbxmcp.JobResult](t, cs, "wait", map[string]any{"id": res.Job.ID, "port": "any", "timeout_ms": 30000})
		if w.Port == nil || w.Port.Address != "127.0.0.1" || w.Done || !strings.Contains(text, "The job listens on 127.0.0.1:") {
			t.Fatalf("wait for a port: %s", text)
		}
		call[any](t, cs, "kill", map[string]any{"id": res.Job.ID})
	})
	t.Run("inline output", func(t *testing.T) {
		m := connectMCP(t, backend("inline"), sbxmcp.Config{Cwd: cwd})
		testMCPInlineOutput(t, m.ClientSession)
	})
	t.Run("continuation", func(t *testing.T) {
		m := connectMCP(t, backend("continuation"), sbxmcp.Config{Cwd: cwd, MaxBlock: time.Second, ProgressEvery: 100 * time.Millisecond})
		testMCPContinuation(t, m)
	})
	t.Run("push", func(t *testing.T) {
		testMCPPush(t, func() *mcpClient { return connectMCP(t, backend("push"), sbxmcp.Config{Cwd: cwd}) })
	})
	t.Run("stdio", func(t *testing.T) {
		testMCPStdio(t, s.addr, "mcp-test-token-mcp-test-token", cwd)
	})
	t.Run("http", func(t *testing.T) {
		testMCPHTTP(t, s.addr, "mcp-test-token-mcp-test-token", cwd)
	})
	t.Run("default protocol", func(t *testing.T) {
		testMCPDefaultProtocol(t, s.addr, "mcp-test-token-mcp-test-token", cwd)
	})
}

// testMCPTools checks what a model learns before it calls anything: the tools, their descriptions,
// annotations and schemas, and the server's instructions.
func testMCPTools(t *testing.T, cs *mcp.ClientSession) {
	ctx := t.Context()
	init := cs.InitializeResult()
	for _, want := range []string{"AwaitShell", "pattern", "ack", "seq", "continuation", "30 KiB", "50s"} {
		if !strings.Contains(init.Instructions, want) {
			t.Errorf("instructions lack %q:\n%s", want, init.Instructions)
		}
	}
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*mcp.Tool{}
	var names []string
	for _, tool := range tools.Tools {
		byName[tool.Name] = tool
		names = append(names, tool.Name)
	}
	if got := strings.Join(names, " "); got != "ack end_session kill list notifications output run runners send status wait" {
		t.Fatalf("tools: %s", got)
	}
	readOnly := map[string]bool{"wait": true, "output": true, "status": true, "list": true, "notifications": true, "runners": true}
	destructive := map[string]bool{"run": true, "kill": true, "end_session": true, "send": true}
	for name, tool := range byName {
		a := tool.Annotations
		if a == nil {
			t.Errorf("%s has no annotations", name)
			continue
		}
		if a.ReadOnlyHint != readOnly[name] {
			t.Errorf("%s: readOnlyHint %v", name, a.ReadOnlyHint)
		}
		if !readOnly[name] && (a.DestructiveHint == nil || *a.DestructiveHint != destructive[name]) {
			t.Errorf("%s: destructiveHint %v", name, a.DestructiveHint)
		}
		if a.OpenWorldHint == nil || *a.OpenWorldHint != (name == "run") {
			t.Errorf("%s: openWorldHint %v", name, a.OpenWorldHint)
		}
		if len(tool.Description) < 80 {
			t.Errorf("%s: description too thin: %q", name, tool.Description)
		}
	}
	// The seeds' guidance: when not to poll, wait slices, what to do with a hung job, the output
	// file's header, kill <pid>.
	for name, want := range map[string]string{"run": "block_until_ms", "wait": "pattern", "notifications": "ack"} {
		if !strings.Contains(byName[name].Description, want) {
			t.Errorf("%s's description does not mention %s", name, want)
		}
	}
	for name, wants := range map[string][]string{
		"run":  {"do not wait for that", "head -n 10", "kill <pid>", "one-shot"},
		"wait": {"Prefer NOT to poll", "60–270 s", "appears hung", "kill <pid>", "stale notifications"},
	} {
		for _, want := range wants {
			if !strings.Contains(byName[name].Description, want) {
				t.Errorf("%s's description lacks %q", name, want)
			}
		}
	}
	// end_session says what a session id is.
	schema, _ := json.Marshal(byName["end_session"].InputSchema)
	if !strings.Contains(string(schema), "the session id: the name that groups jobs") {
		t.Errorf("end_session's schema: %s", schema)
	}
	// Only the command is required to run.
	schema, _ = json.Marshal(byName["run"].InputSchema)
	var rs struct {
		Required   []string `json:"required"`
		Properties map[string]struct {
			Required []string `json:"required"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(schema, &rs); err != nil {
		t.Fatal(err)
	}
	if strings.Join(rs.Required, ",") != "command" || len(rs.Properties["limits"].Required) != 0 {
		t.Errorf("run's schema requires %v, limits %v", rs.Required, rs.Properties["limits"].Required)
	}

	if _, _, err := callTool[any](ctx, cs, "status", map[string]any{"id": "nosuchjob"}, nil); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Errorf("status of an unknown job: %v", err)
	}
	// An id is one path segment, dots too: ".." is a bad job id, not the parent route.
	for _, tool := range []string{"status", "kill"} {
		if _, _, err := callTool[any](ctx, cs, tool, map[string]any{"id": ".."}, nil); err == nil || !strings.Contains(err.Error(), `job id ".." must be`) {
			t.Errorf("%s of job \"..\": %v", tool, err)
		}
	}
}

// testMCPInlineOutput checks that a result carries the end of a large output, on a character
// boundary, and says where the rest is.
func testMCPInlineOutput(t *testing.T, cs *mcp.ClientSession) {
	// 60000 lines of "é NNNNN\n": 540000 bytes, 2-byte characters throughout.
	text, res := call[sbxmcp.JobResult](t, cs, "run", map[string]any{
		"command": `i=0; while [ $i -lt 60000 ]; do printf 'é %05d\n' $i; i=$((i+1)); done`, "block_until_ms": 60000,
	})
	if !res.Done || res.Job.OutputBytes != 540000 {
		t.Fatalf("run: %+v", res.Job)
	}
	// The last 30 KiB, from the first line that starts in them: 3413 lines of 9 bytes.
	if len(res.Output) != 3413*9 {
		t.Errorf("inline output of %d bytes, want the last %d lines", len(res.Output), 3413)
	}
	if want := "[showing the last 3413 of 60000 lines; the full output is in " + res.Job.OutputPath + "]\né 56587\n"; !strings.Contains(text, want) {
		t.Errorf("result text lacks %q:\n%s", want, text[:400])
	}
	if !utf8.ValidString(res.Output) || !strings.HasPrefix(res.Output, "é 56587\n") || !strings.HasSuffix(res.Output, "é 59999\n") || res.OutputEnd != 540000 ||
		res.OutputOffset != res.OutputEnd-int64(len(res.Output)) {
		t.Errorf("inline output [%d, %d) of %q...%q", res.OutputOffset, res.OutputEnd, res.Output[:20], res.Output[len(res.Output)-20:])
	}
	if len(text) > sbxmcp.InlineOutput+2048 {
		t.Errorf("result text of %d bytes", len(text))
	}
	for _, want := range []string{`"offset":0`, res.Job.OutputPath, "of 540000"} {
		if !strings.Contains(text, want) {
			t.Errorf("result text does not point to the rest (%q):\n%s", want, text[:400])
		}
	}
	// The rest, paged with output.
	text, page := call[sbxmcp.OutputResult](t, cs, "output", map[string]any{"id": res.Job.ID})
	if page.Offset != 0 || page.End != sbxmcp.InlineOutput || page.Total != 540000 || !strings.HasPrefix(page.Output, "é 00000\né 00001\n") {
		t.Errorf("output page: [%d, %d) of %d", page.Offset, page.End, page.Total)
	}
	if !strings.HasSuffix(text, `more: call output with {"id":"`+res.Job.ID+`","offset":30720}]`) {
		t.Errorf("output page text ends %q", text[len(text)-80:])
	}
	_, page = call[sbxmcp.OutputResult](t, cs, "output", map[string]any{"id": res.Job.ID, "offset": 539991, "limit": 1 << 30})
	if page.Output != "é 59999\n" || page.End != 540000 {
		t.Errorf("last page: %+v", page)
	}
}

// testMCPContinuation checks that blocking calls return by the configured bound with a
// continuation that goes on waiting, and report progress meanwhile.
func testMCPContinuation(t *testing.T, m *mcpClient) {
	cs := m.ClientSession
	ctx := t.Context()
	begin := time.Now()
	text, res, err := callTool[sbxmcp.JobResult](ctx, cs, "run", map[string]any{"command": "echo started; sleep 60", "block_until_ms": 20000}, "p1")
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(begin)
	if took > 5*time.Second || res.Done || res.Next == nil || res.Next.Tool != "wait" {
		t.Fatalf("run blocked %s: %+v\n%s", took, res, text)
	}
	args := res.Next.Arguments
	if args["id"] != res.Job.ID || args["timeout_ms"].(float64) > 19500 || args["timeout_ms"].(float64) < 10000 || args["offset"].(float64) != 8 {
		t.Errorf("continuation %v", args)
	}
	if !strings.Contains(text, "call wait with {") || !strings.Contains(text, "started\n") {
		t.Errorf("run text:\n%s", text)
	}
	if m.progressCount() < 3 {
		t.Errorf("%d progress notifications in %s", m.progressCount(), took)
	}

	// The continuation goes on: no output since the offset, and another continuation.
	begin = time.Now()
	text, res = call[sbxmcp.JobResult](t, cs, "wait", args)
	if time.Since(begin) > 5*time.Second || res.Done || res.Next == nil || res.Next.Arguments["timeout_ms"].(float64) >= args["timeout_ms"].(float64) {
		t.Fatalf("wait: %+v", res)
	}
	if res.Output != "" || !strings.Contains(text, "no new output") {
		t.Errorf("wait from the offset shows %q:\n%s", res.Output, text)
	}
	// A wait that asked for less than the bound returns without a continuation.
	_, res = call[sbxmcp.JobResult](t, cs, "wait", map[string]any{"id": res.Job.ID, "timeout_ms": 10})
	if res.Next != nil || res.Done {
		t.Errorf("short wait: %+v", res)
	}
	call[any](t, cs, "kill", map[string]any{"id": res.Job.ID})
	if _, res = call[sbxmcp.JobResult](t, cs, "wait", map[string]any{"id": res.Job.ID, "timeout_ms": 20000}); !res.Done || res.Job.Reason != "killed" {
		t.Errorf("wait after kill: %+v", res.Job)
	}

	// A wait without a job sleeps, bounded the same way.
	begin = time.Now()
	text, res = call[sbxmcp.JobResult](t, cs, "wait", map[string]any{"timeout_ms": 3000})
	if took := time.Since(begin); took > 2500*time.Millisecond || res.SleptMS < 900 || res.Job != nil || res.Next == nil || res.Next.Arguments["timeout_ms"].(float64) > 2100 {
		t.Errorf("sleep of 3s took %s: %+v\n%s", took, res, text)
	}

	// A notifications wait is bounded the same way. (The session's own kill notified nothing.)
	begin = time.Now()
	text, _ = call[client.Notifications](t, cs, "notifications", map[string]any{"wait_ms": 30000})
	if time.Since(begin) > 5*time.Second || !strings.Contains(text, "call notifications with {") {
		t.Errorf("notifications wait (%s): %s", time.Since(begin), text)
	}
}

// testMCPPush checks that notifications are pushed as log messages as they are stored, are not
// acked by the push, and are pushed no more once acked.
func testMCPPush(t *testing.T, connect func() *mcpClient) {
	ctx := t.Context()
	a := connect()
	if err := a.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatal(err)
	}
	_, res := call[sbxmcp.JobResult](t, a.ClientSession, "run", map[string]any{"command": "sleep 0.2; exit 3", "title": "pushed"})
	n := nextPush(t, a.logs, res.Job.ID)
	if !strings.Contains(n.Text, "<system_notification>") || !strings.Contains(n.Text, "task_id: "+res.Job.ID) || n.Status != "error" {
		t.Errorf("pushed notification: %+v", n)
	}

	// The push did not ack: notifications lists it, and a second connection gets it pushed too.
	text, page := call[client.Notifications](t, a.ClientSession, "notifications", nil)
	if len(page.Notifications) != 1 || page.Notifications[0].Seq != n.Seq || !strings.Contains(text, `call ack with {"seq":`) {
		t.Fatalf("notifications after a push: %+v", page)
	}
	b := connect()
	// A client that sets its log level a while after it connected still gets what was pending.
	time.Sleep(200 * time.Millisecond)
	if err := b.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatal(err)
	}
	if again := nextPush(t, b.logs, res.Job.ID); again.Seq != n.Seq {
		t.Errorf("second connection got seq %d, want %d", again.Seq, n.Seq)
	}
	// Once acked, it is neither listed nor pushed to a new connection.
	call[any](t, a.ClientSession, "ack", map[string]any{"seq": n.Seq})
	if _, page := call[client.Notifications](t, a.ClientSession, "notifications", nil); len(page.Notifications) != 0 {
		t.Errorf("notifications after ack: %+v", page)
	}
	c := connect()
	if err := c.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-c.logs:
		t.Errorf("pushed after ack: %+v", l)
	case <-time.After(300 * time.Millisecond):
	}
}

// nextPush returns the next pushed notification of a job.
func nextPush(t *testing.T, logs <-chan *mcp.LoggingMessageParams, job string) client.Notification {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case l := <-logs:
			data, _ := json.Marshal(l.Data)
			var n client.Notification
			if err := json.Unmarshal(data, &n); err != nil {
				t.Fatalf("log data %s: %v", data, err)
			}
			if l.Logger != "sbx" || n.Seq == 0 {
				t.Fatalf("log message %+v", l)
			}
			if n.JobID == job {
				return n
			}
		case <-deadline:
			t.Fatalf("no notification of job %s pushed", job)
		}
	}
}
