// Command sbx runs shell commands for AI coding agents: `sbx serve` starts everything on one machine,
// `sbx coordinator` and `sbx runner` scale it out, and the other subcommands are the client.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sbx-dev/sbx/sandbox"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	sandbox.MaybeInit()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// exitError ends the program with a given code; a message, when set, goes to stderr.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// usageError is a command line mistake: exit code 2.
func usageError(format string, args ...any) error {
	return &exitError{code: 2, msg: fmt.Sprintf(format, args...)}
}

// exitCode turns run's error into the process's exit code, printing its one-line message.
func exitCode(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	var e *exitError
	if errors.As(err, &e) {
		if e.msg != "" {
			fmt.Fprintln(stderr, "sbx: "+e.msg)
		}
		return e.code
	}
	fmt.Fprintln(stderr, "sbx: "+err.Error())
	return 1
}

const usage = `usage: sbx <command> [flags]

Servers:
  serve        coordinator + embedded NATS + a runner, on this machine
  coordinator  the coordinator, against an external NATS
  runner       a runner, against an external NATS
  auth         NATS credentials: init (a fleet's authority), runner (one runner's creds)
  token        API tokens: create --sessions PREFIX (a token limited to those sessions)

Client (SBX_ADDR, default http://127.0.0.1:7070; SBX_TOKEN):
  run [flags] -- COMMAND...   start a job
  ps                          list jobs
  status ID                   show a job
  wait ID                     wait for a job to end (or --pattern to match, --port N|any to listen)
  logs [-f] ID                print a job's output
  kill ID                     stop a job
  send ID TEXT...             write TEXT and a newline to a job's input (started with --stdin or --tty)
  runners                     list runners
  events [-f] [--session S]   print (and ack) notifications; -f follows
  end-session S               end a session: stop its jobs, without notifications
  mcp [--session S]           an MCP server on stdin/stdout whose tools are the API's operations

Run 'sbx <command> -h' for a command's flags.`

// run is the whole program: it parses args and runs one subcommand.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return &exitError{code: 2}
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return cmdServe(ctx, rest, getenv, stdout, stderr)
	case "coordinator":
		return cmdCoordinator(ctx, rest, getenv, stdout, stderr)
	case "runner":
		return cmdRunner(ctx, rest, getenv, stderr)
	case "run", "ps", "status", "wait", "logs", "kill", "send", "runners", "events", "end-session":
		return cmdClient(ctx, cmd, rest, getenv, stdout, stderr)
	case "auth":
		return cmdAuth(rest, stdout, stderr)
	case "mcp":
		return cmdMCP(ctx, rest, getenv, stderr)
	case "token":
		return cmdToken(rest, getenv, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	case "version", "--version":
		fmt.Fprintln(stdout, "sbx "+version)
		return nil
	default:
		fmt.Fprintln(stderr, usage)
		return usageError("unknown command %q", cmd)
	}
}

func newLogger(stderr io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// supervise runs part until ctx ends. A part that returns while ctx is live stopped by itself: that
// is an error even when it says nil, so that the process exits non-zero and whatever supervises it
// (systemd, compose) restarts it. Once ctx ended, the part's cancellation is no error.
func supervise(ctx context.Context, name string, part func(context.Context) error) error {
	err := part(ctx)
	switch {
	case ctx.Err() == nil && err == nil:
		return fmt.Errorf("%s stopped by itself", name)
	case ctx.Err() == nil:
		return fmt.Errorf("%s stopped: %w", name, err)
	case errors.Is(err, context.Canceled):
		return nil
	}
	return err
}
