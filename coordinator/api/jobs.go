package api

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
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

// Job is the API's job object (docs/api.md "Job object"). Unset values are null, not absent, so
// that encoding a decoded Job gives back the API's object: exit_code until the end, pid before the
// start, started_at, ended_at, usage.
type Job struct {
	ID      string `json:"id"`
	Session string `json:"session"`
	Title   string `json:"title"`
	Command string `json:"command"`
	// Source is null for a command; {ws} for a job whose output is a WebSocket's messages.
	Source   *Source `json:"source"`
	Cwd      string  `json:"cwd"`
	Readonly bool    `json:"readonly"`
	User     string  `json:"user"`
	Shell    string  `json:"shell"`
	Linger   bool    `json:"linger"`
	Stdin    bool    `json:"stdin"`
	Pool     string  `json:"pool"`
	Status   string  `json:"status"`
	// QueuedReason says why a queued job has not started yet; null otherwise.
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
	// ToolCallID is the tool call that started the job (the start's tool_call_id or tool_use_id),
	// when its start named one.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// LingerCgroup: the job lasts until every process it started has exited.
	LingerCgroup bool `json:"linger_cgroup"`
	// TTY: the job runs on a terminal of TTYSize (null without one). Ports are the TCP addresses its
	// processes listen on ([] when none).
	TTY     bool     `json:"tty"`
	TTYSize *TTYSize `json:"tty_size"`
	Ports   []Port   `json:"ports"`
}

// Ended reports whether the job's status is final.
func (j *Job) Ended() bool {
	return j.Status == StatusSucceeded || j.Status == StatusFailed || j.Status == StatusAborted
}

// TTYSize is the size of a job's terminal, in a start's body and in the job object.
type TTYSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// Port is a TCP address a job listens on.
type Port struct {
	Address string `json:"address"`
	Port    int    `json:"port"`
}

// Limits bound a job, in a start's body and in the job object; 0 means the runner's default. The
// job object shows every limit.
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

// NotifyOnOutput is a start's notify_on_output, and the job object's: Pattern is RE2, matched per
// line; Reason (default: the pattern) is quoted in the notifications; DebounceMS (default and
// minimum 5000) groups matches. A start's "" and 0 are the defaults; the job object shows the
// values the server keeps.
type NotifyOnOutput struct {
	Pattern    string `json:"pattern"`
	Reason     string `json:"reason"`
	DebounceMS int64  `json:"debounce_ms"`
}

// StartRequest is the body of POST RouteJobs: it asks for a job. Command (or Source) and Cwd are
// required; the rest defaults.
type StartRequest struct {
	// IdempotencyKey, when set, is sent as HeaderIdempotencyKey: a repeat of the start with it gets
	// the first one's job rather than a new one.
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
	// <task-notification> as <tool_use_id>). ToolUseID is Claude Code's name for it: a start gives
	// one of them, or both the same.
	ToolCallID string `json:"tool_call_id,omitempty"`
	ToolUseID  string `json:"tool_use_id,omitempty"`
	// LingerCgroup keeps the job until every process it started has exited, a daemon that
	// redirected its output (nohup setsid srv >/dev/null 2>&1 &) included: it stays a job to wait
	// on and kill.
	LingerCgroup bool `json:"linger_cgroup,omitempty"`
	// TTY runs the job on a pseudo-terminal of TTYSize (nil: 24×80).
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

// StartReply is the reply to a start. Output is the output so far (all of it when the job ended in
// time, else at most its last 30 KiB, from a line's start) as a string: bytes that were not valid
// UTF-8 arrive as U+FFFD, so a client that needs the exact bytes reads RouteJobOutput.
type StartReply struct {
	Job    Job    `json:"job"`
	Output string `json:"output"`
	// OutputTruncated says Output is only the end of the OutputBytes there are; OutputLines and
	// OutputTotalLines count the lines shown and all, for a rendering's note.
	OutputTruncated  bool  `json:"output_truncated"`
	OutputBytes      int64 `json:"output_bytes"`
	OutputLines      int   `json:"output_lines"`
	OutputTotalLines int   `json:"output_total_lines"`
	Backgrounded     bool  `json:"backgrounded"`
	// ReplyUS is the reply's own stage after Job.Timings: µs from the start's acceptance to the
	// reply, as it is written; nil for the repeat of an earlier start.
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

// JobsQuery selects jobs in a listing; zero fields select everything (Limit 0: the server's
// default, 100).
type JobsQuery struct {
	Session string
	Status  string
	Limit   int
}

// Path is the path of the listing: RouteJobs with the query.
func (q JobsQuery) Path() string {
	v := url.Values{}
	if q.Session != "" {
		v.Set("session", q.Session)
	}
	if q.Status != "" {
		v.Set("status", q.Status)
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	return withQuery(RouteJobs, v)
}

// JobsReply is the reply to a listing, newest first.
type JobsReply struct {
	Jobs []Job `json:"jobs"`
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
	// Port is the port the wait asked for (port=N or any), once the job listens on it; else nil.
	Port *Port `json:"port"`
}

// SleepReply is the reply to RouteSleep: how long the server slept.
type SleepReply struct {
	SleptMS int64 `json:"slept_ms"`
}

// KillRequest is the body of RouteJobKill, which may be empty: Signal ("": TERM, then KILL after
// 2 s), and the caller's Session (else HeaderSession's, else default): a kill from the job's own
// session notifies nothing.
type KillRequest struct {
	Signal  string `json:"signal"`
	Session string `json:"session,omitempty"`
}

// JobReply is the reply to a kill and a resize: the job.
type JobReply struct {
	Job Job `json:"job"`
}

// StdinRequest is the body of RouteJobStdin: text for the job's input, and whether to close the
// input after it (EOF).
type StdinRequest struct {
	Data  string `json:"data"`
	Close bool   `json:"close"`
}

// StdinReply is the reply to RouteJobStdin.
type StdinReply struct {
	Written int  `json:"written"`
	Closed  bool `json:"closed"`
}

// ResizeRequest is the body of RouteJobResize: the terminal's new size, both required (nil: not
// given).
type ResizeRequest struct {
	Rows *int `json:"rows"`
	Cols *int `json:"cols"`
}

// Runner is a runner the coordinator hears from, one element of RouteRunners' array.
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
	// Draining: the runner was told to stop; it takes no work and lets its jobs finish.
	Draining bool `json:"draining"`
}
