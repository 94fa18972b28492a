package coordinator

import (
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sbx-dev/sbx/proto"
)

// Bounds of a start request. They are documented in docs/limits.md.
const (
	// MaxBlockUntil and MaxWaitTimeout are the seed tools' longest wait (119 minutes); a longer one
	// is clamped to it.
	MaxBlockUntil    = 7140 * time.Second
	MaxWaitTimeout   = 7140 * time.Second
	DefaultWait      = 30 * time.Second
	MinMemoryBytes   = 4 << 20
	MinCPUMillicores = 10
	// MaxToolCallID bounds a start's tool_call_id (tool call ids are tens of characters).
	MaxToolCallID = 256
	// MaxReplyOutput is the most output a start's reply carries inline, as the MCP tools do: an
	// agent's context is the scarce thing, and the rest is in the file.
	MaxReplyOutput = 30 << 10
)

// StartRequest asks for a job.
type StartRequest struct {
	Command string
	// Source, instead of Command, makes the job's output a WebSocket's messages, read by the runner.
	Source   *Source
	Cwd      string
	Title    string
	Env      map[string]string
	Readonly bool
	// User names the account the job runs as on its runner ("": the runner's default).
	User string
	// Linger keeps the job until its output closes, not only until its shell exits. LingerCgroup
	// keeps it until every process it started has exited, daemons that closed their output too.
	Linger       bool
	LingerCgroup bool
	// Stdin gives the job an input pipe, written with Input; else it reads /dev/null.
	Stdin bool
	// TTY runs the job on a pseudo-terminal of TTYSize (nil: 24×80); Input types on it.
	TTY     bool
	TTYSize *TTYSize
	// Shell is "sh", "bash" or "" for the runner's default (bash where installed).
	Shell      string
	Pool       string
	Session    string
	Limits     Limits
	BlockUntil time.Duration
	// NotifyOnOutput asks for notifications when output lines match a pattern.
	NotifyOnOutput *OutputNotify
	// Monitor makes every output line a notification; Persistent lifts a monitor's timeout.
	Monitor    bool
	Persistent bool
	// NotificationFormat is the format of the job's notifications ("": its session's).
	NotificationFormat Format
	// ToolCallID is the agent's tool call that starts the job ("": none): its notifications name it.
	ToolCallID string
}

// Source is where a job's output comes from when it runs no command.
type Source struct {
	// WS is a ws:// or wss:// URL; each message received is one or more output lines.
	WS string `json:"ws"`
}

// validateSource checks a source job's fields; its cwd, which nothing uses, defaults to "/".
func (r *StartRequest) validateSource() error {
	switch {
	case r.Command != "":
		return Errorf(EINVALID, "command and source exclude each other: give one.")
	case r.Readonly:
		return Errorf(EINVALID, "source: a readonly job has no network; a WebSocket source cannot be readonly.")
	case r.Stdin:
		return Errorf(EINVALID, "stdin: a WebSocket source takes no input.")
	case r.TTY:
		return Errorf(EINVALID, "tty: a WebSocket source has no terminal.")
	}
	if err := (&proto.Source{WS: r.Source.WS}).Validate(); err != nil {
		return Errorf(EINVALID, "%s.", strings.TrimPrefix(err.Error(), proto.ErrInvalid.Error()+": "))
	}
	if r.Cwd == "" {
		r.Cwd = "/"
	}
	return nil
}

// validate checks every field, naming the first one that is wrong, and fills defaults.
func (r *StartRequest) validate(checkCwd bool, minDebounce time.Duration) error {
	if r.Source != nil {
		if err := r.validateSource(); err != nil {
			return err
		}
	} else if strings.TrimSpace(r.Command) == "" {
		return Errorf(EINVALID, "command is required and must not be blank (or give a source instead).")
	}
	if len(r.Command) > proto.MaxCommandBytes {
		return Errorf(EINVALID, "command is %d bytes; the limit is %d.", len(r.Command), proto.MaxCommandBytes)
	}
	if strings.IndexByte(r.Command, 0) >= 0 {
		return Errorf(EINVALID, "command must not contain a NUL byte.")
	}
	if !utf8.ValidString(r.Command) {
		return Errorf(EINVALID, "command is not valid UTF-8.")
	}
	if r.Cwd == "" {
		return Errorf(EINVALID, "cwd is required: give the absolute directory the command runs in.")
	}
	if !filepath.IsAbs(r.Cwd) || len(r.Cwd) > proto.MaxPathBytes || strings.IndexByte(r.Cwd, 0) >= 0 {
		return Errorf(EINVALID, "cwd %q must be an absolute path.", r.Cwd)
	}
	r.Cwd = filepath.Clean(r.Cwd)
	if checkCwd {
		if fi, err := os.Stat(r.Cwd); err != nil || !fi.IsDir() {
			return Errorf(EINVALID, "cwd %q is not an existing directory.", r.Cwd)
		}
	}
	if len(r.Title) > proto.MaxTitleBytes {
		return Errorf(EINVALID, "title is %d bytes; the limit is %d.", len(r.Title), proto.MaxTitleBytes)
	}
	if strings.IndexByte(r.Title, 0) >= 0 || !utf8.ValidString(r.Title) {
		return Errorf(EINVALID, "title must be valid UTF-8 without a NUL byte.")
	}
	if r.Title == "" {
		r.Title = DefaultTitle(r.Command)
		if r.Source != nil {
			r.Title = DefaultTitle(r.Source.WS)
		}
	}
	if err := proto.ValidateEnv(r.Env); err != nil {
		return Errorf(EINVALID, "env: %s.", strings.TrimPrefix(err.Error(), proto.ErrInvalid.Error()+": "))
	}
	if r.User != "" && !proto.ValidUser(r.User) {
		return Errorf(EINVALID, "user %q must be a user name: 1-%d characters of letters, digits, '_', '-' and '.'.", r.User, proto.MaxUserBytes)
	}
	if r.Shell != "" && r.Shell != proto.ShellSh && r.Shell != proto.ShellBash {
		return Errorf(EINVALID, "shell %q must be sh or bash (or absent: the runner's default, bash where installed).", r.Shell)
	}
	if r.Pool == "" {
		r.Pool = "default"
	}
	if !proto.ValidToken(r.Pool) {
		return Errorf(EINVALID, "pool %q must be 1-64 characters of letters, digits, '_' and '-'.", r.Pool)
	}
	if r.Session == "" {
		r.Session = "default"
	}
	if err := validSession(r.Session); err != nil {
		return err
	}
	// The wire's validators, on a copy: the runner holds the work to the same bounds and words.
	l := r.Limits
	wire := proto.Limits{MemoryBytes: l.MemoryBytes, CPUMillicores: l.CPUMillicores, Pids: l.Pids, OutputBytes: l.OutputBytes, TimeoutMS: l.TimeoutMS}
	if err := wire.Validate(); err != nil {
		return Errorf(EINVALID, "%s.", strings.TrimPrefix(err.Error(), proto.ErrInvalid.Error()+": "))
	}
	if m := r.Limits.MemoryBytes; m != 0 && m < MinMemoryBytes {
		return Errorf(EINVALID, "limits.memory_bytes %d is below the minimum of %d.", m, MinMemoryBytes)
	}
	if c := r.Limits.CPUMillicores; c != 0 && c < MinCPUMillicores {
		return Errorf(EINVALID, "limits.cpu_millicores %d is below the minimum of %d.", c, MinCPUMillicores)
	}
	if r.BlockUntil < 0 {
		return Errorf(EINVALID, "block_until_ms must not be negative.")
	}
	// Clamped, as the agent tools do: a model asking for an hour gets the longest foreground wait.
	r.BlockUntil = min(r.BlockUntil, MaxBlockUntil)
	if r.NotifyOnOutput != nil {
		n := *r.NotifyOnOutput // the caller's value stays as it was
		if err := n.validate(minDebounce); err != nil {
			return err
		}
		r.NotifyOnOutput = &n
	}
	if len(r.ToolCallID) > MaxToolCallID || strings.ContainsFunc(r.ToolCallID, unicode.IsControl) || !utf8.ValidString(r.ToolCallID) {
		return Errorf(EINVALID, "tool_call_id must be at most %d bytes of valid UTF-8 with no control characters.", MaxToolCallID)
	}
	if _, err := ParseFormat("notification_format", string(r.NotificationFormat)); err != nil {
		return err
	}
	if r.TTYSize != nil {
		if !r.TTY {
			return Errorf(EINVALID, "tty_size applies only to a job with tty: true.")
		}
		if err := (proto.TTYSize{Rows: r.TTYSize.Rows, Cols: r.TTYSize.Cols}).Validate("tty_size"); err != nil {
			return Errorf(EINVALID, "%s.", strings.TrimPrefix(err.Error(), proto.ErrInvalid.Error()+": "))
		}
	}
	if r.Persistent && !r.Monitor {
		return Errorf(EINVALID, "persistent applies only to a monitor: set monitor as well.")
	}
	return nil
}
