package client

import (
	"encoding/json"
	"fmt"
	"time"
)

// Job statuses.
const (
	StatusQueued    = "queued"
	StatusRunning   = "running"
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
	StatusAborted   = "aborted"
)

// Job is the API's job object. Nullable fields are pointers and encode as null, so that encoding
// a Job gives back the API's object.
type Job struct {
	ID       string  `json:"id"`
	Session  string  `json:"session"`
	Title    string  `json:"title"`
	Command  string  `json:"command"`
	Source   *Source `json:"source"`
	Cwd      string  `json:"cwd"`
	Readonly bool    `json:"readonly"`
	User     string  `json:"user"`
	Shell    string  `json:"shell"`
	Linger   bool    `json:"linger"`
	Stdin    bool    `json:"stdin"`
	Pool     string  `json:"pool"`
	Status   string  `json:"status"`
	// QueuedReason says why a queued job has not started yet.
	QueuedReason *string    `json:"queued_reason"`
	Reason       string     `json:"reason"`
	ExitCode     *int       `json:"exit_code"`
	Pid          *int       `json:"pid"`
	Runner       string     `json:"runner"`
	CreatedAt    time.Time  `json:"created_at"`
	StartedAt    *time.Time `json:"started_at"`
	EndedAt      *time.Time `json:"ended_at"`
	ElapsedMS    int64      `json:"elapsed_ms"`
	OutputBytes  int64      `json:"output_bytes"`
	OutputPath   string     `json:"output_path"`
	Limits       Limits     `json:"limits"`
	Usage        *Usage     `json:"usage"`
	// Timings are when the job passed each stage.
	Timings Timings `json:"timings"`
	Error   string  `json:"error,omitempty"`
	// NotifyOnOutput, Monitor and Persistent are what the start asked for.
	NotifyOnOutput *NotifyOnOutput `json:"notify_on_output"`
	Monitor        bool            `json:"monitor"`
	Persistent     bool            `json:"persistent"`
	// ToolCallID is the tool call that started the job, when its start named one.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// LingerCgroup: the job lasts until every process it started has exited.
	LingerCgroup bool `json:"linger_cgroup"`
	// TTY: the job runs on a terminal of TTYSize (null without one). Ports are the TCP addresses its
	// processes listen on.
	TTY     bool     `json:"tty"`
	TTYSize *TTYSize `json:"tty_size"`
	Ports   []Port   `json:"ports"`
}

// TTYSize is the size of a job's terminal.
type TTYSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// Port is a TCP address a job listens on.
type Port struct {
	Address string `json:"address"`
	Port    int    `json:"port"`
}

// Ended reports whether the job's status is final.
func (j *Job) Ended() bool {
	return j.Status == StatusSucceeded || j.Status == StatusFailed || j.Status == StatusAborted
}

// Limits bound a job; zero means the default.
type Limits struct {
	MemoryBytes   int64 `json:"memory_bytes"`
	CPUMillicores int64 `json:"cpu_millicores"`
	Pids          int64 `json:"pids"`
	OutputBytes   int64 `json:"output_bytes"`
	TimeoutMS     int64 `json:"timeout_ms"`
}

// Usage is what an ended job consumed.
type Usage struct {
	CPUMS           int64  `json:"cpu_ms"`
	MemoryPeakBytes uint64 `json:"memory_peak_bytes"`
}

// Timings are when a job passed each stage of its way, in µs since the coordinator accepted its
// start, in this order (a stage is never shown before the one it follows); nil: not passed, or
// not known. The runner's stages (TakenUS to ExecUS, ExitUS) are its clock's, placed on the
// coordinator's (docs/api.md "Timings").
type Timings struct {
	StoredUS      *int64 `json:"stored_us"`
	PublishedUS   *int64 `json:"published_us"`
	TakenUS       *int64 `json:"taken_us"`
	CgroupUS      *int64 `json:"cgroup_us"`
	ExecUS        *int64 `json:"exec_us"`
	FirstOutputUS *int64 `json:"first_output_us"`
	ExitUS        *int64 `json:"exit_us"`
	ExitStoredUS  *int64 `json:"exit_stored_us"`
}

// Source is where a job's output comes from when it runs no command: a WebSocket's messages.
type Source struct {
	WS string `json:"ws"`
}

// StartRequest asks for a job. Command (or Source) and Cwd are required; the rest defaults.
type StartRequest struct {
	// IdempotencyKey, when set, is sent as the Idempotency-Key header: a repeat of the start with
	// it gets the first one's job rather than a new one. With it, Start retries a request whose
	// connection failed, since the retry cannot start the command twice (NewIdempotencyKey).
	IdempotencyKey string `json:"-"`

	Command  string            `json:"command,omitempty"`
	Source   *Source           `json:"source,omitempty"`
	Cwd      string            `json:"cwd"`
	Title    string            `json:"title,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Readonly bool              `json:"readonly,omitempty"`
	User     string            `json:"user,omitempty"`
	Shell    string            `json:"shell,omitempty"`
	Linger   bool              `json:"linger,omitempty"`
	Stdin    bool              `json:"stdin,omitempty"`
	Pool     string            `json:"pool,omitempty"`
	Session  string            `json:"session,omitempty"`
	Limits   *Limits           `json:"limits,omitempty"`
	// NotifyOnOutput asks for a notification when an output line matches its pattern.
	NotifyOnOutput *NotifyOnOutput `json:"notify_on_output,omitempty"`
	// Monitor makes every output line a notification; Persistent lifts a monitor's timeout.
	Monitor    bool `json:"monitor,omitempty"`
	Persistent bool `json:"persistent,omitempty"`
	// NotificationFormat is the format of the job's notifications (FormatSystem or FormatTask;
	// "": its session's).
	NotificationFormat string `json:"notification_format,omitempty"`
	// ToolCallID is the agent's tool call that starts the job: its notifications echo it (in
	// <task-notification> as <tool_use_id>).
	ToolCallID string `json:"tool_call_id,omitempty"`
	// LingerCgroup keeps the job until every process it started has exited, a daemon that
	// redirected its output (nohup setsid srv >/dev/null 2>&1 &) included: it stays a job to wait
	// on and kill.
	LingerCgroup bool `json:"linger_cgroup,omitempty"`
	// TTY runs the job on a pseudo-terminal of TTYSize (nil: 24×80): Input types on it.
	TTY     bool     `json:"tty,omitempty"`
	TTYSize *TTYSize `json:"tty_size,omitempty"`
	// BlockUntil makes the call wait up to this long for the job to end (sent as block_until_ms).
	BlockUntil time.Duration `json:"-"`
}

// MarshalJSON encodes the request as the API's body, BlockUntil as block_until_ms.
func (r StartRequest) MarshalJSON() ([]byte, error) {
	type plain StartRequest // without this method
	return json.Marshal(struct {
		plain
		BlockUntilMS int64 `json:"block_until_ms,omitempty"`
	}{plain(r), r.BlockUntil.Milliseconds()})
}

// NotifyOnOutput is a start's notify_on_output: Pattern is RE2, matched per line; Reason (default:
// the pattern) is quoted in the notifications; DebounceMS (default and minimum 5000) groups matches.
type NotifyOnOutput struct {
	Pattern    string `json:"pattern"`
	Reason     string `json:"reason,omitempty"`
	DebounceMS int64  `json:"debounce_ms,omitempty"`
}

// StartReply is the reply to a start. Output is the output so far (all of it when the job ended in
// time) as a string: bytes that were not valid UTF-8 arrive as U+FFFD; Output on Client reads the
// exact bytes.
type StartReply struct {
	Job    Job    `json:"job"`
	Output string `json:"output"`
	// OutputTruncated says Output is only the end (the last 30 KiB at most, from a line's start) of
	// the OutputBytes there are; OutputLines and OutputTotalLines count the lines shown and all.
	OutputTruncated  bool  `json:"output_truncated"`
	OutputBytes      int64 `json:"output_bytes"`
	OutputLines      int   `json:"output_lines"`
	OutputTotalLines int   `json:"output_total_lines"`
	Backgrounded     bool  `json:"backgrounded"`
	// ReplyUS is the µs from the start's acceptance to this reply, on the clock of Job.Timings;
	// nil for the repeat of an earlier start.
	ReplyUS *int64 `json:"reply_us"`
}

// TruncationNote is the line a text rendering writes above a cut output, the background shell
// tool's ("" when the output is whole).
func (r *StartReply) TruncationNote() string {
	if !r.OutputTruncated {
		return ""
	}
	return fmt.Sprintf("[showing the last %d of %d lines; the full output is in %s]", r.OutputLines, r.OutputTotalLines, r.Job.OutputPath)
}

// WaitReply is what a wait saw.
type WaitReply struct {
	Job            Job  `json:"job"`
	Done           bool `json:"done"`
	PatternMatched bool `json:"pattern_matched"`
	// Matched is the text the pattern matched (at most 4096 bytes), MatchedOffset where it starts in
	// the output; both null without a match.
	Matched       *string `json:"matched"`
	MatchedOffset *int64  `json:"matched_offset"`
	// Port is the port the wait asked for, once the job listens on it; else nil.
	Port *Port `json:"port"`
}

// JobsQuery selects jobs in a listing; zero fields select everything (Limit 0: the server's
// default, 100).
type JobsQuery struct {
	Session string
	Status  string
	Limit   int
}

// Runner is a runner the coordinator hears from.
type Runner struct {
	ID             string            `json:"id"`
	Pool           string            `json:"pool"`
	Slots          int               `json:"slots"`
	Running        int               `json:"running"`
	Readonly       bool              `json:"readonly"`
	ReadonlyReason string            `json:"readonly_reason"`
	Cgroup         string            `json:"cgroup"`
	Labels         map[string]string `json:"labels"`
	LastSeen       time.Time         `json:"last_seen"`
	Version        string            `json:"version"`
	Draining       bool              `json:"draining"`
}
