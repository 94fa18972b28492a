package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/coordinator/mcp"
)

// cmdMCP serves the API's operations as MCP tools over stdin and stdout.
func cmdMCP(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := newFlags("mcp", stderr)
	session := fs.String("session", "", "session of the jobs started through this server (default: the API's)")
	maxBlock := fs.Duration("max-block", mcp.DefaultMaxBlock, "longest a tool call blocks before it returns a continuation (MCP clients give up after 60s)")
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
	h := mcp.NewHost(ctx, mcp.Config{MaxBlock: *maxBlock, Cwd: cwd, Format: *format, Logger: newLogger(stderr), Version: version})
	defer h.Close()
	return h.ServeStdio(ctx, c)
}
