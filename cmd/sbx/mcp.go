package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbx-dev/sbx/coordinator/client"
)

// mcpOutputLimit is the most output one `output` call returns unless asked for more: an agent's
// context is the scarce thing.
const mcpOutputLimit = 64 << 10

// cmdMCP serves the API's operations as MCP tools over stdin and stdout.
func cmdMCP(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := newFlags("mcp", stderr)
	session := fs.String("session", "", "session of the jobs started through this server (default: the API's)")
	if pos, err := parseArgs(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return usageError("mcp takes no arguments")
	}
	c, err := client.FromEnv(getenv)
	if err != nil {
		return err
	}
	c.Session = *session
	return newMCPServer(c).Run(ctx, &mcp.StdioTransport{})
}

// Tool inputs. Their JSON is the API's, so most are sent as they are.
type (
	mcpStart struct {
		Command        string            `json:"command" jsonschema:"the shell command, run with sh -c"`
		Cwd            string            `json:"cwd" jsonschema:"absolute directory to run in"`
		Title          string            `json:"title,omitempty" jsonschema:"short title; default: the command's first line"`
		Env            map[string]string `json:"env,omitempty" jsonschema:"variables added to the environment"`
		Readonly       bool              `json:"readonly,omitempty" jsonschema:"run sandboxed: reads work, no file is written, no network"`
		Pool           string            `json:"pool,omitempty" jsonschema:"pool of runners"`
		Session        string            `json:"session,omitempty" jsonschema:"session of the job"`
		Limits         *client.Limits    `json:"limits,omitempty" jsonschema:"memory_bytes, cpu_millicores, pids, output_bytes, timeout_ms; 0 is the default"`
		BlockUntilMS   int64             `json:"block_until_ms,omitempty" jsonschema:"wait up to this long for the job to end and return its output; 0 returns at once"`
		NotifyOnOutput *mcpNotifyOn      `json:"notify_on_output,omitempty" jsonschema:"notify when an output line matches"`
		Monitor        bool              `json:"monitor,omitempty" jsonschema:"every output line is a notification"`
		Persistent     bool              `json:"persistent,omitempty" jsonschema:"a monitor without a timeout"`
	}
	mcpNotifyOn struct {
		Pattern    string `json:"pattern" jsonschema:"RE2 pattern matched against each line"`
		Reason     string `json:"reason,omitempty" jsonschema:"why, shown in the notification"`
		DebounceMS int64  `json:"debounce_ms,omitempty" jsonschema:"window in which later matches are counted (at least 5000)"`
	}
	mcpJob struct {
		ID string `json:"id" jsonschema:"the job id"`
	}
	mcpList struct {
		Session string `json:"session,omitempty" jsonschema:"only this session's jobs"`
		Status  string `json:"status,omitempty" jsonschema:"queued, running, succeeded, failed or aborted"`
		Limit   int    `json:"limit,omitempty" jsonschema:"at most this many, newest first (default 100)"`
	}
	mcpWait struct {
		ID        string `json:"id" jsonschema:"the job id"`
		TimeoutMS int64  `json:"timeout_ms,omitempty" jsonschema:"give up after this long (default 30000)"`
		Pattern   string `json:"pattern,omitempty" jsonschema:"return when this RE2 pattern matches the output so far"`
	}
	mcpOutput struct {
		ID     string `json:"id" jsonschema:"the job id"`
		Offset int64  `json:"offset,omitempty" jsonschema:"first byte"`
		Limit  int64  `json:"limit,omitempty" jsonschema:"at most this many bytes (default 65536)"`
	}
	mcpKill struct {
		ID     string `json:"id" jsonschema:"the job id"`
		Signal string `json:"signal,omitempty" jsonschema:"TERM (default, then KILL after 2 s), KILL, INT, HUP, QUIT, USR1, USR2"`
	}
	mcpNotifications struct {
		Session string `json:"session,omitempty" jsonschema:"the session (default: this server's)"`
		After   *int64 `json:"after,omitempty" jsonschema:"notifications after this seq (default: the session's acked cursor)"`
		WaitMS  int64  `json:"wait_ms,omitempty" jsonschema:"wait up to this long for one"`
	}
	mcpAck struct {
		Session string `json:"session" jsonschema:"the session"`
		Seq     int64  `json:"seq" jsonschema:"everything up to this seq is delivered"`
	}
	mcpNone struct{}
)

// newMCPServer returns the MCP server whose tools call the coordinator through c.
func newMCPServer(c *client.Client) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "sbx", Version: version}, nil)
	call := func(ctx context.Context, method, path string, body any) (*mcp.CallToolResult, any, error) {
		raw, err := c.Do(ctx, method, path, body)
		if err != nil {
			return nil, nil, err
		}
		return text(string(raw)), nil, nil
	}
	jobPath := func(id, suffix string) string { return "/v1/jobs/" + url.PathEscape(id) + suffix }

	mcp.AddTool(s, &mcp.Tool{Name: "run", Description: "Start a shell command in the background, or wait for it with block_until_ms. Returns the job, its output so far and whether it is still running."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in mcpStart) (*mcp.CallToolResult, any, error) {
			return call(ctx, "POST", "/v1/jobs", in)
		})
	mcp.AddTool(s, &mcp.Tool{Name: "status", Description: "Show one job."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in mcpJob) (*mcp.CallToolResult, any, error) {
			return call(ctx, "GET", jobPath(in.ID, ""), nil)
		})
	mcp.AddTool(s, &mcp.Tool{Name: "list", Description: "List jobs, newest first."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in mcpList) (*mcp.CallToolResult, any, error) {
			return call(ctx, "GET", client.JobsPath(client.JobsQuery{Session: in.Session, Status: in.Status, Limit: in.Limit}), nil)
		})
	mcp.AddTool(s, &mcp.Tool{Name: "wait", Description: "Wait until a job ends, its output matches a pattern, or the timeout. A wait that sees the end means no finished notification follows."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in mcpWait) (*mcp.CallToolResult, any, error) {
			v := url.Values{}
			if in.TimeoutMS > 0 {
				v.Set("timeout_ms", strconv.FormatInt(in.TimeoutMS, 10))
			}
			if in.Pattern != "" {
				v.Set("pattern", in.Pattern)
			}
			return call(ctx, "GET", jobPath(in.ID, "/wait?"+v.Encode()), nil)
		})
	mcp.AddTool(s, &mcp.Tool{Name: "output", Description: "Read a job's output (stdout and stderr interleaved), from an offset."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in mcpOutput) (*mcp.CallToolResult, any, error) {
			limit := in.Limit
			if limit <= 0 {
				limit = mcpOutputLimit
			}
			out, total, err := c.Output(ctx, in.ID, in.Offset, limit)
			if err != nil {
				return nil, nil, err
			}
			msg := string(out)
			if end := in.Offset + int64(len(out)); end < total {
				msg += fmt.Sprintf("\n[%d more bytes: call output with offset=%d]", total-end, end)
			}
			return text(msg), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "kill", Description: "Stop a job and everything it started."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in mcpKill) (*mcp.CallToolResult, any, error) {
			var body any
			if in.Signal != "" {
				body = map[string]string{"signal": in.Signal}
			}
			return call(ctx, "POST", jobPath(in.ID, "/kill"), body)
		})
	mcp.AddTool(s, &mcp.Tool{Name: "notifications", Description: "Notifications of a session after a seq: jobs that finished, matched a pattern, or wait at a prompt. Each carries a <system_notification> text."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in mcpNotifications) (*mcp.CallToolResult, any, error) {
			v := url.Values{}
			if session := cmp.Or(in.Session, c.Session); session != "" {
				v.Set("session", session)
			}
			if in.After != nil {
				v.Set("after", strconv.FormatInt(*in.After, 10))
			}
			if in.WaitMS > 0 {
				v.Set("wait_ms", strconv.FormatInt(in.WaitMS, 10))
			}
			return call(ctx, "GET", "/v1/notifications?"+v.Encode(), nil)
		})
	mcp.AddTool(s, &mcp.Tool{Name: "ack", Description: "Mark a session's notifications up to seq as delivered."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in mcpAck) (*mcp.CallToolResult, any, error) {
			return call(ctx, "POST", "/v1/notifications/ack", in)
		})
	mcp.AddTool(s, &mcp.Tool{Name: "end_session", Description: "End a session: its running jobs stop, with no notifications."},
		func(ctx context.Context, _ *mcp.CallToolRequest, in mcpJob) (*mcp.CallToolResult, any, error) {
			return call(ctx, "DELETE", "/v1/sessions/"+url.PathEscape(in.ID), nil)
		})
	mcp.AddTool(s, &mcp.Tool{Name: "runners", Description: "List the runners, their slots and whether they can run readonly jobs."},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ mcpNone) (*mcp.CallToolResult, any, error) {
			return call(ctx, "GET", "/v1/runners", nil)
		})
	return s
}

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}
