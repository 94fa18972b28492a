package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbx-dev/sbx/coordinator/client"
)

const (
	// ClaudeChannel is the experimental capability of Claude Code's channels: a server that declares
	// it may send claudeChannelMethod, whose content Claude Code puts in the model's context as a
	// <channel source="NAME" ...> event.
	ClaudeChannel       = "claude/channel"
	claudeChannelMethod = "notifications/claude/channel"
	// pushPoll is how long one long-poll of a pusher waits for a notification.
	pushPoll = time.Minute
	// pushRetry is the pause after a failed long-poll (the coordinator restarting, say).
	pushRetry = time.Second
)

// startPusher pushes the notifications of c's session to ss as they are stored, until ss closes or
// h closes (which closes ss). It starts at the session's acked cursor and never acks: see push.
// It runs for sessions opened by initialize, the only ones the server offers (sessionVersions):
// a client asking for a later protocol falls back to initialize.
//
// It reads the first notification only once the client can receive one: when it declared Claude
// Code's channel, or once it set a log level (the SDK drops log messages until then, and a
// notification pending when the connection opened would be lost to it).
func (h *Host) startPusher(ss *sdk.ServerSession, c *client.Client, raw *rawTransport) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pushers[ss] != nil {
		return // a second notifications/initialized
	}
	levelSet := make(chan struct{})
	h.pushers[ss] = levelSet
	ctx, cancel := context.WithCancel(h.ctx)
	h.wg.Add(2)
	go func() {
		defer h.wg.Done()
		_ = ss.Wait() // the client went away
		cancel()
	}()
	go func() {
		defer h.wg.Done()
		defer func() {
			ss.Close() // h closed: the session ends with it
			h.mu.Lock()
			delete(h.pushers, ss)
			h.mu.Unlock()
		}()
		if raw == nil || !declares(ss, ClaudeChannel) {
			select {
			case <-levelSet:
			case <-ctx.Done():
				return
			}
		}
		h.push(ctx, ss, c, raw)
	}()
}

// watchLogLevel is a middleware that tells a session's pusher when its client set a log level.
func (h *Host) watchLogLevel(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		res, err := next(ctx, method, req)
		if ss, ok := req.GetSession().(*sdk.ServerSession); ok && err == nil && method == "logging/setLevel" {
			h.mu.Lock()
			if levelSet := h.pushers[ss]; levelSet != nil {
				select {
				case <-levelSet:
				default:
					close(levelSet)
				}
			}
			h.mu.Unlock()
		}
		return res, err
	}
}

// push sends each notification of the session as it is stored: as an MCP log message
// (notifications/message, to a client that chose a log level), and, to a client that declares
// Claude Code's channel capability, as a channel event. A push does not ack: a client may not show
// it to its model (Claude Code shows log messages to no one but its debug log, and drops channel
// events unless channels were enabled at launch), so the acked cursor moves only when the agent
// acks what it acted on. A session's notification is pushed at most once on one connection.
func (h *Host) push(ctx context.Context, ss *sdk.ServerSession, c *client.Client, raw *rawTransport) {
	var after *uint64 // nil: the session's acked cursor
	for ctx.Err() == nil {
		page, err := c.QueryNotifications(ctx, client.NotificationsQuery{After: after, Wait: pushPoll, Format: h.cfg.Format})
		if err != nil {
			if ctx.Err() == nil {
				h.cfg.Logger.Warn("mcp: read notifications to push", "err", err)
				sleepCtx(ctx, pushRetry)
			}
			continue
		}
		for _, n := range page.Notifications {
			// A push that fails is not retried: over HTTP, a client without an open GET stream
			// has nowhere to receive it, and its session goes on. The notification stays unacked.
			if err := sendNotification(ctx, ss, raw, &n); err != nil && ctx.Err() == nil {
				h.cfg.Logger.Debug("mcp: push a notification", "seq", n.Seq, "err", err)
			}
		}
		next := page.Next
		after = &next
	}
}

// logLevel is the log level of a notification with status.
func logLevel(status string) sdk.LoggingLevel {
	switch status {
	case "success":
		return "info"
	case "aborted":
		return "warning"
	case "error":
		return "error"
	}
	return "notice"
}

func sendNotification(ctx context.Context, ss *sdk.ServerSession, raw *rawTransport, n *client.Notification) error {
	// The data is the API's notification object, text included.
	if err := ss.Log(ctx, &sdk.LoggingMessageParams{Level: logLevel(n.Status), Logger: "sbx", Data: n}); err != nil {
		return err
	}
	if raw == nil || !declares(ss, ClaudeChannel) {
		return nil
	}
	return raw.notify(ctx, claudeChannelMethod, map[string]any{
		"content": n.Text,
		// Claude Code shows each meta key as an attribute of the <channel> tag.
		"meta": map[string]string{"seq": strconv.FormatUint(n.Seq, 10), "session": n.Session, "job_id": n.JobID, "kind": n.Kind, "status": n.Status},
	})
}

// declares reports whether the client declared an experimental capability.
func declares(ss *sdk.ServerSession, capability string) bool {
	p := ss.InitializeParams()
	if p == nil || p.Capabilities == nil {
		return false
	}
	_, ok := p.Capabilities.Experimental[capability]
	return ok
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// rawTransport is a transport whose connection can also carry notifications the SDK has no method
// for. The SDK's connections allow concurrent writes.
type rawTransport struct {
	sdk.Transport
	mu   sync.Mutex
	conn sdk.Connection
}

func (t *rawTransport) Connect(ctx context.Context) (sdk.Connection, error) {
	conn, err := t.Transport.Connect(ctx)
	if err == nil {
		t.mu.Lock()
		t.conn = conn
		t.mu.Unlock()
	}
	return conn, err
}

// notify sends a JSON-RPC notification on the connection.
func (t *rawTransport) notify(ctx context.Context, method string, params any) error {
	t.mu.Lock()
	conn := t.conn
	t.mu.Unlock()
	if conn == nil {
		return fmt.Errorf("%s: not connected", method)
	}
	data, err := json.Marshal(params)
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	return conn.Write(ctx, &jsonrpc.Request{Method: method, Params: data})
}
