package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbx-dev/sbx/coordinator/client"
)

// Bounds of what one MCP tool call returns and how long it blocks (docs/mcp.md).
const (
	// mcpInlineOutput is the most output a tool result carries: the last 30 KiB of it for run and
	// wait, the first from the offset for output. An agent's context is the scarce thing; the rest
	// is paged with the output tool or read from the job's output_path.
	mcpInlineOutput = 30 << 10
	// mcpMaxOutputLimit is the most the output tool returns when asked for more.
	mcpMaxOutputLimit = 256 << 10
	// mcpDefaultMaxBlock is how long a blocking call waits at most before it returns a continuation:
	// MCP clients give up on a call after 60 s by default (error -32001), and an agent whose `run`
	// timed out never learns the job's id.
	mcpDefaultMaxBlock = 50 * time.Second
	// mcpProgressEvery is how often a blocking call reports progress to a client that asked for it.
	mcpProgressEvery = 5 * time.Second
)

// mcpConfig is what an MCP server needs besides its client of the API.
type mcpConfig struct {
	// MaxBlock bounds how long one tool call blocks (default mcpDefaultMaxBlock); a longer wait is
	// a loop of calls, each returning a continuation.
	MaxBlock time.Duration
	// ProgressEvery is the interval of progress notifications (default mcpProgressEvery).
	ProgressEvery time.Duration
	// Cwd is run's directory when the call names none; "" makes cwd required.
	Cwd string
	// Format is the format of the notification texts this server reads, pushed or listed
	// (client.FormatSystem, client.FormatTask; "": as each was stored).
	Format string
	// Logger receives what the pushers cannot tell a client (default: discard).
	Logger *slog.Logger
}

func (c mcpConfig) withDefaults() mcpConfig {
	if c.MaxBlock <= 0 {
		c.MaxBlock = mcpDefaultMaxBlock
	}
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = mcpProgressEvery
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// mcpHost owns what outlives one tool call: the goroutines that push each MCP session's
// notifications. close ends them and the sessions they serve.
type mcpHost struct {
	cfg    mcpConfig
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	// pushers holds the sessions with a pusher, each with the channel closed when its client sets a
	// log level.
	pushers map[*mcp.ServerSession]chan struct{}
	// schemas keeps the tools' JSON schemas across the servers of HTTP sessions.
	schemas *mcp.SchemaCache
}

func newMCPHost(ctx context.Context, cfg mcpConfig) *mcpHost {
	h := &mcpHost{cfg: cfg.withDefaults(), pushers: map[*mcp.ServerSession]chan struct{}{}, schemas: mcp.NewSchemaCache()}
	h.ctx, h.cancel = context.WithCancel(ctx)
	return h
}

// close stops every pusher, closing its session, and waits for them.
func (h *mcpHost) close() {
	h.cancel()
	h.wg.Wait()
}

// cmdMCP serves the API's operations as MCP tools over stdin and stdout.
func cmdMCP(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := newFlags("mcp", stderr)
	session := fs.String("session", "", "session of the jobs started through this server (default: the API's)")
	maxBlock := fs.Duration("max-block", mcpDefaultMaxBlock, "longest a tool call blocks before it returns a continuation (MCP clients give up after 60s)")
	format := fs.String("format", "", "write the notifications' texts as system_notification or task_notification (Claude Code's) (default: as stored)")
	if pos, err := parseArgs(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return usageError("mcp takes no arguments")
	}
	if err := checkMaxBlock("--max-block", *maxBlock); err != nil {
		return err
	}
	if f := *format; f != "" && f != client.FormatSystem && f != client.FormatTask {
		return usageError("--format must be %s or %s", client.FormatSystem, client.FormatTask)
	}
	c, err := client.FromEnv(getenv)
	if err != nil {
		return err
	}
	c.Session = *session
	// An agent's harness starts the server in the project's directory: a job runs there unless
	// the call names another.
	cwd, err := os.Getwd()
	if err != nil {
		return fmt.Errorf("current directory: %w", err)
	}
	h := newMCPHost(ctx, mcpConfig{MaxBlock: *maxBlock, Cwd: cwd, Format: *format, Logger: newLogger(stderr)})
	defer h.close()
	t := &rawTransport{Transport: &mcp.StdioTransport{}}
	return h.server(c, t).Run(ctx, t)
}

// mcpStatelessVersion is the first MCP protocol version without sessions (SEP-2575).
const mcpStatelessVersion = "2026-07-28"

// mcpSessionVersions returns the protocol versions the SDK supports that open a session.
func mcpSessionVersions() []string {
	var vs []string
	for _, v := range mcp.SupportedProtocolVersions() {
		if v < mcpStatelessVersion { // the versions are dates: they sort as strings
			vs = append(vs, v)
		}
	}
	return vs
}

// checkMaxBlock checks the value of a flag that bounds how long a tool call blocks.
func checkMaxBlock(flag string, d time.Duration) error {
	if d < time.Second || d > 10*time.Minute {
		return usageError("%s must be between 1s and 10m", flag)
	}
	return nil
}

// mcpInstructions is the server's instructions: what a model needs to use the tools together.
const mcpInstructions = `sbx runs shell commands as background jobs, each in its own cgroup (optionally read-only sandboxed), on this machine or a fleet, and tells you when they end, print a line you asked about, or wait at a prompt.

Jobs: "run" starts a command. With block_until_ms it waits for the end and returns the exit code and output (builds, tests, one-off commands); without, it returns the job id at once (servers, watchers, long builds). No call blocks longer than %s: a call that reaches that returns the job id, the output so far and a continuation, the exact "wait" call to make next. A long wait is a loop of such calls.
Pattern (as AwaitShell): start a server in the background, then call "wait" with a pattern that matches the line saying it is up, e.g. {"id":ID,"pattern":"listening on|ready"}; then use it, and "kill" it when done.

Input: a job started with stdin: true reads what "send" writes, e.g. the answer to a prompt that a stall notification reported; other jobs read nothing. "wait" without an id just sleeps.

Output: a result shows at most the last %d KiB of output, with its byte offsets. Page through the rest with "output" (offset, limit), or read the job's output_path when you share the coordinator's machine.

Notifications: when a background job ends (unless run or wait saw the end), when an output line matches notify_on_output, or when a job seems to wait at a prompt, sbx stores a notification for the job's session, with a seq and a text (a <system_notification> or <task-notification> block). They are pushed to you as they happen (%s) and listed by "notifications". After acting on them, call "ack" with the highest seq: acked ones are not listed again; one you have already seen (same seq) may appear again until acked.

Sessions: every job belongs to a session (this connection's is %s). "end_session" stops all of a session's jobs without notifications.`

// server returns an MCP server whose tools call the API through c, and whose sessions' notifications
// are pushed by h. raw, when set, is the transport the server runs on: it also carries Claude Code
// channel events, which the SDK has no method for.
func (h *mcpHost) server(c *client.Client, raw *rawTransport) *mcp.Server {
	session := `"default"`
	if c.Session != "" {
		session = fmt.Sprintf("%q", c.Session)
	}
	caps := &mcp.ServerCapabilities{Logging: &mcp.LoggingCapabilities{}}
	pushedAs := "as MCP log messages, once your client sets a log level"
	if raw != nil {
		pushedAs += `; in Claude Code with channels enabled, as <channel source="sbx"> events`
		// Claude Code injects a channel's events into the model's context (when started with
		// --channels or --dangerously-load-development-channels server:NAME).
		caps.Experimental = map[string]any{claudeChannel: map[string]any{}}
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "sbx", Title: "sbx background jobs", Version: version}, &mcp.ServerOptions{
		Instructions: fmt.Sprintf(mcpInstructions, h.cfg.MaxBlock, mcpInlineOutput>>10, pushedAs, session),
		Capabilities: caps,
		SchemaCache:  h.schemas,
		// Push needs a session: a connection opened by initialize, on which the server may speak
		// outside a call. From 2026-07-28 (SEP-2575) a client opens none: it sends server/discover
		// and then stateless requests, log messages go only to the request they belong to, and no
		// notifications/initialized ever starts a pusher. Offering only the versions before it makes
		// such a client fall back to initialize at the newest of them (the SDK's client does so on
		// its own), over stdio as over HTTP, whose stateful handler offers no more either.
		SupportedProtocolVersions: mcpSessionVersions(),
		InitializedHandler: func(_ context.Context, req *mcp.InitializedRequest) {
			h.startPusher(req.Session, c, raw)
		},
	})
	s.AddReceivingMiddleware(h.watchLogLevel)
	t := &mcpTools{c: c, cfg: h.cfg}
	t.register(s)
	return s
}
