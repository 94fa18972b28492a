// Package mcp serves the API's operations as MCP tools, and pushes each MCP session's notifications
// as they are stored. Its tools call the API through the Go client: over HTTP for sbx mcp on
// stdio, and in-process, through the API's own handler, for the coordinator's /mcp (HTTP).
package mcp

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbx-dev/sbx/coordinator/client"
)

// Bounds of what one MCP tool call returns and how long it blocks (docs/mcp.md).
const (
	// InlineOutput is the most output a tool result carries: the last 30 KiB of it for run and
	// wait, the first from the offset for output. An agent's context is the scarce thing; the rest
	// is paged with the output tool or read from the job's output_path.
	InlineOutput = 30 << 10
	// maxOutputLimit is the most the output tool returns when asked for more.
	maxOutputLimit = 256 << 10
	// DefaultMaxBlock is how long a blocking call waits at most before it returns a continuation:
	// MCP clients give up on a call after 60 s by default (error -32001), and an agent whose `run`
	// timed out never learns the job's id.
	DefaultMaxBlock = 50 * time.Second
	// progressEvery is how often a blocking call reports progress to a client that asked for it.
	progressEvery = 5 * time.Second
)

// Config is what an MCP server needs besides its client of the API.
type Config struct {
	// MaxBlock bounds how long one tool call blocks (default DefaultMaxBlock); a longer wait is
	// a loop of calls, each returning a continuation.
	MaxBlock time.Duration
	// ProgressEvery is the interval of progress notifications (default progressEvery).
	ProgressEvery time.Duration
	// Cwd is run's directory when the call names none; "" makes cwd required.
	Cwd string
	// Format is the format of the notification texts this server reads, pushed or listed
	// (client.FormatSystem, client.FormatTask; "": as each was stored).
	Format string
	// Logger receives what the pushers cannot tell a client (default: discard).
	Logger *slog.Logger
	// Version is the server's version, as initialize reports it.
	Version string
}

func (c Config) withDefaults() Config {
	if c.MaxBlock <= 0 {
		c.MaxBlock = DefaultMaxBlock
	}
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = progressEvery
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Host owns what outlives one tool call: the goroutines that push each MCP session's
// notifications. Close ends them and the sessions they serve.
type Host struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	// pushers holds the sessions with a pusher, each with the channel closed when its client sets a
	// log level.
	pushers map[*sdk.ServerSession]chan struct{}
	// schemas keeps the tools' JSON schemas across the servers of HTTP sessions.
	schemas *sdk.SchemaCache
}

// NewHost returns a host whose pushers end with ctx or Close.
func NewHost(ctx context.Context, cfg Config) *Host {
	h := &Host{cfg: cfg.withDefaults(), pushers: map[*sdk.ServerSession]chan struct{}{}, schemas: sdk.NewSchemaCache()}
	h.ctx, h.cancel = context.WithCancel(ctx)
	return h
}

// Close stops every pusher, closing its session, and waits for them.
func (h *Host) Close() {
	h.cancel()
	h.wg.Wait()
}

// StatelessVersion is the first MCP protocol version without sessions (SEP-2575).
const StatelessVersion = "2026-07-28"

// sessionVersions returns the protocol versions the SDK supports that open a session.
func sessionVersions() []string {
	var vs []string
	for _, v := range sdk.SupportedProtocolVersions() {
		if v < StatelessVersion { // the versions are dates: they sort as strings
			vs = append(vs, v)
		}
	}
	return vs
}

// instructions is the server's instructions: what a model needs to use the tools together.
const instructions = `sbx runs shell commands as background jobs, each in its own cgroup (optionally read-only sandboxed), on this machine or a fleet, and tells you when they end, print a line you asked about, or wait at a prompt.

Jobs: "run" starts a command. With block_until_ms it waits for the end and returns the exit code and output (builds, tests, one-off commands); without, it returns the job id at once (servers, watchers, long builds). No call blocks longer than %s: a call that reaches that returns the job id, the output so far and a continuation, the exact "wait" call to make next. A long wait is a loop of such calls.
Pattern (as AwaitShell): start a server in the background, then call "wait" with a pattern that matches the line saying it is up, e.g. {"id":ID,"pattern":"listening on|ready"}; then use it, and "kill" it when done.

Input: a job started with stdin: true reads what "send" writes, e.g. the answer to a prompt that a stall notification reported; other jobs read nothing. "wait" without an id just sleeps.

Output: a result shows at most the last %d KiB of output, with its byte offsets. Page through the rest with "output" (offset, limit), or read the job's output_path when you share the coordinator's machine.

Notifications: when a background job ends (unless run or wait saw the end), when an output line matches notify_on_output, or when a job seems to wait at a prompt, sbx stores a notification for the job's session, with a seq and a text (a <system_notification> or <task-notification> block). They are pushed to you as they happen (%s) and listed by "notifications". After acting on them, call "ack" with the highest seq: acked ones are not listed again; one you have already seen (same seq) may appear again until acked.

Sessions: every job belongs to a session (this connection's is %s). "end_session" stops all of a session's jobs without notifications.`

// ServeStdio serves the tools over stdin and stdout, calling the API through c, until the client
// closes them or ctx ends. Its transport also carries Claude Code's channel events.
func (h *Host) ServeStdio(ctx context.Context, c *client.Client) error {
	t := &rawTransport{Transport: &sdk.StdioTransport{}}
	return h.server(c, t).Run(ctx, t)
}

// Server returns an MCP server whose tools call the API through c, for a transport of the caller's
// (one without channel events).
func (h *Host) Server(c *client.Client) *sdk.Server { return h.server(c, nil) }

// server returns an MCP server whose tools call the API through c, and whose sessions' notifications
// are pushed by h. raw, when set, is the transport the server runs on: it also carries Claude Code
// channel events, which the SDK has no method for.
func (h *Host) server(c *client.Client, raw *rawTransport) *sdk.Server {
	session := `"default"`
	if c.Session != "" {
		session = fmt.Sprintf("%q", c.Session)
	}
	caps := &sdk.ServerCapabilities{Logging: &sdk.LoggingCapabilities{}}
	pushedAs := "as MCP log messages, once your client sets a log level"
	if raw != nil {
		pushedAs += `; in Claude Code with channels enabled, as <channel source="sbx"> events`
		// Claude Code injects a channel's events into the model's context (when started with
		// --channels or --dangerously-load-development-channels server:NAME).
		caps.Experimental = map[string]any{ClaudeChannel: map[string]any{}}
	}
	s := sdk.NewServer(&sdk.Implementation{Name: "sbx", Title: "sbx background jobs", Version: h.cfg.Version}, &sdk.ServerOptions{
		Instructions: fmt.Sprintf(instructions, h.cfg.MaxBlock, InlineOutput>>10, pushedAs, session),
		Capabilities: caps,
		SchemaCache:  h.schemas,
		// Push needs a session: a connection opened by initialize, on which the server may speak
		// outside a call. From 2026-07-28 (SEP-2575) a client opens none: it sends server/discover
		// and then stateless requests, log messages go only to the request they belong to, and no
		// notifications/initialized ever starts a pusher. Offering only the versions before it makes
		// such a client fall back to initialize at the newest of them (the SDK's client does so on
		// its own), over stdio as over HTTP, whose stateful handler offers no more either.
		SupportedProtocolVersions: sessionVersions(),
		InitializedHandler: func(_ context.Context, req *sdk.InitializedRequest) {
			h.startPusher(req.Session, c, raw)
		},
	})
	s.AddReceivingMiddleware(h.watchLogLevel)
	t := &tools{c: c, cfg: h.cfg}
	t.register(s)
	return s
}
