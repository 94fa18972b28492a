package coordinator

import (
	"crypto/rand"
	"encoding/hex"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-dev/sbx/proto"
)

// Status is where a job is in its life: queued → running → succeeded | failed | aborted.
type Status string

// Statuses.
const (
	StatusQueued    Status = "queued"
	StatusRunning   Status = "running"
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
	StatusAborted   Status = "aborted"
)

// Ended reports whether the status is final.
func (s Status) Ended() bool {
	return s == StatusSucceeded || s == StatusFailed || s == StatusAborted
}

// Valid reports whether s is one of the statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusQueued, StatusRunning, StatusSucceeded, StatusFailed, StatusAborted:
		return true
	}
	return false
}

// Limits bound one job; zero means the default (for output and timeout: none). The JSON names are
// the ones the store has always kept.
type Limits struct {
	MemoryBytes   int64 `json:"memory_bytes,omitempty"`
	CPUMillicores int64 `json:"cpu_millicores,omitempty"`
	Pids          int64 `json:"pids,omitempty"`
	OutputBytes   int64 `json:"output_bytes,omitempty"`
	TimeoutMS     int64 `json:"timeout_ms,omitempty"`
}

// Usage is what a job consumed, read from its cgroup by its runner.
type Usage struct {
	CPUMS           int64  `json:"cpu_ms"`
	MemoryPeakBytes uint64 `json:"memory_peak_bytes"`
}

// TTYSize is the size of a job's terminal, in character cells.
type TTYSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// Port is a TCP address a job listens on.
type Port struct {
	Address string `json:"address"`
	Port    int    `json:"port"`
}

// Job is one command: what was asked, where it runs and how it ended. It is stored whole; the HTTP
// adapter decides what the API shows.
type Job struct {
	ID          string     `json:"id"`
	Session     string     `json:"session"`
	Title       string     `json:"title"`
	Command     string     `json:"command"`
	Source      *Source    `json:"source,omitempty"`
	Cwd         string     `json:"cwd"`
	Readonly    bool       `json:"readonly"`
	User        string     `json:"user,omitempty"`
	Shell       string     `json:"shell,omitempty"`
	Linger      bool       `json:"linger,omitempty"`
	Stdin       bool       `json:"stdin,omitempty"`
	Pool        string     `json:"pool"`
	Status      Status     `json:"status"`
	Reason      string     `json:"reason,omitempty"`
	Error       string     `json:"error,omitempty"`
	ExitCode    *int       `json:"exit_code,omitempty"`
	Signal      int        `json:"signal,omitempty"`
	Pid         int        `json:"pid,omitempty"`
	Runner      string     `json:"runner,omitempty"`
	CreatedAt   time.Time  `json:"created_at"`
	AcceptedAt  *time.Time `json:"accepted_at,omitempty"`
	StartedAt   *time.Time `json:"started_at,omitempty"`
	EndedAt     *time.Time `json:"ended_at,omitempty"`
	OutputBytes int64      `json:"output_bytes"`
	OutputPath  string     `json:"output_path"`
	Limits      Limits     `json:"limits"`
	Usage       *Usage     `json:"usage,omitempty"`
	// WorkSeq is the sequence of the job's work message in the work stream, to withdraw it while queued.
	WorkSeq uint64 `json:"work_seq,omitempty"`
	// Claim is the job's Work.Claim: only an event or chunk that carries it is the job's. The
	// API never shows it.
	Claim string `json:"claim,omitempty"`
	// Notify, Monitor and Persistent are what the request asked to be told about the output.
	Notify     *OutputNotify `json:"notify_on_output,omitempty"`
	Monitor    bool          `json:"monitor,omitempty"`
	Persistent bool          `json:"persistent,omitempty"`
	// NotificationFormat is the format of the job's notifications ("": its session's).
	NotificationFormat Format `json:"notification_format,omitempty"`
	// ToolCallID is the agent's tool call that started the job, echoed in its notifications.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// LingerCgroup keeps the job until its cgroup is empty (StartRequest.LingerCgroup).
	LingerCgroup bool `json:"linger_cgroup,omitempty"`
	// Observed is set when the end was seen by a waiting caller, so no finished notification was sent.
	Observed bool `json:"observed,omitempty"`
	// TTY runs the job on a pseudo-terminal of TTYSize (nil: 24×80).
	TTY     bool     `json:"tty,omitempty"`
	TTYSize *TTYSize `json:"tty_size,omitempty"`
	// Ports are the TCP addresses the job's processes listen on, as its runner last saw them.
	Ports []Port `json:"ports,omitempty"`
	// QueuedReason says why a queued job waits, from what the coordinator knows of the runners at the
	// time it is read; it is not stored.
	QueuedReason string `json:"-"`
	// Timings are when the job passed each stage, in µs since its start was accepted.
	Timings Timings `json:"timings"`
}

// ElapsedMS is the time from start to end (or to now while running); 0 before the start.
func (j *Job) ElapsedMS(now time.Time) int64 {
	if j.StartedAt == nil {
		return 0
	}
	end := now
	if j.EndedAt != nil {
		end = *j.EndedAt
	}
	return end.Sub(*j.StartedAt).Milliseconds()
}

// end moves the job to its final status. The status follows from the reason and exit code: an exit
// succeeds or fails, a start that failed fails, and any stop from outside the command (a kill, a
// signal, a limit, a lost runner) aborts, as the agent tools report it.
func (j *Job) end(at time.Time, reason string, exitCode *int) {
	j.Reason = reason
	j.ExitCode = exitCode
	j.EndedAt = &at
	switch {
	case reason == proto.ReasonExit && exitCode != nil && *exitCode == 0:
		j.Status = StatusSucceeded
	case reason == proto.ReasonExit || reason == proto.ReasonStartFailed:
		j.Status = StatusFailed
	default:
		j.Status = StatusAborted
	}
}

// DefaultTitle is the first line of the command cut to 80 characters.
func DefaultTitle(command string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(command), "\n")
	line = strings.TrimSpace(line)
	if r := []rune(line); len(r) > 80 {
		line = string(r[:80])
	}
	return line
}

// newJobID returns a 13-character id that sorts by creation time: 9 base-36 digits of the Unix
// millisecond and 4 random ones. It is a valid subject token and cgroup name.
func newJobID(now time.Time) string {
	ms := strconv.FormatInt(now.UnixMilli(), 36)
	ms = strings.Repeat("0", 9-len(ms)) + ms
	n, err := rand.Int(rand.Reader, big.NewInt(36*36*36*36))
	if err != nil {
		panic("coordinator: crypto/rand failed: " + err.Error())
	}
	r := strconv.FormatInt(n.Int64(), 36)
	return ms + strings.Repeat("0", 4-len(r)) + r
}

// newClaim returns a random claim token (Work.Claim): 128 bits in 32 hex digits.
func newClaim() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic("coordinator: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b)
}
