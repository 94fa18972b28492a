package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMCP drives the MCP server as an agent's harness would: list the tools, run a command, read its
// output, and get a tool error for an unknown job.
func TestMCP(t *testing.T) {
	s := startServe(t)
	ctx := t.Context()
	serverT, clientT := mcp.NewInMemoryTransports()
	srv := newMCPServer(s.c)
	ss, err := srv.Connect(ctx, serverT, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(ctx, clientT, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()

	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	if got := strings.Join(names, " "); got != "ack end_session kill list notifications output run runners status wait" {
		t.Fatalf("tools: %s", got)
	}

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run", Arguments: map[string]any{
		"command": "printf 'hello\\n'; exit 3", "cwd": "/", "block_until_ms": 10000,
	}})
	if err != nil || res.IsError {
		t.Fatalf("run: %+v, %v", res, err)
	}
	var started struct {
		Job struct {
			ID       string `json:"id"`
			ExitCode *int   `json:"exit_code"`
		} `json:"job"`
		Output       string `json:"output"`
		Backgrounded bool   `json:"backgrounded"`
	}
	if err := json.Unmarshal([]byte(res.Content[0].(*mcp.TextContent).Text), &started); err != nil {
		t.Fatal(err)
	}
	if started.Backgrounded || started.Output != "hello\n" || started.Job.ExitCode == nil || *started.Job.ExitCode != 3 {
		t.Fatalf("run result: %+v", started)
	}

	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "output", Arguments: map[string]any{"id": started.Job.ID, "limit": 2}})
	if err != nil || res.IsError {
		t.Fatalf("output: %+v, %v", res, err)
	}
	if got := res.Content[0].(*mcp.TextContent).Text; got != "he\n[4 more bytes: call output with offset=2]" {
		t.Fatalf("output: %q", got)
	}

	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "status", Arguments: map[string]any{"id": "nosuchjob"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "not_found") {
		t.Fatalf("status of an unknown job: %+v", res.Content[0])
	}
}
