package proto

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"
)

// ErrInvalid is wrapped by every decoding or validation error of this package.
var ErrInvalid = errors.New("proto: invalid message")

// Bounds every message is held to on the wire. The coordinator's API applies the same or tighter ones.
const (
	MaxCommandBytes = 64 << 10
	MaxEnvEntries   = 256
	MaxEnvKeyBytes  = 256
	MaxEnvBytes     = 256 << 10
	MaxTitleBytes   = 1024
	MaxPathBytes    = 4096
	MaxChunkBytes   = 64 << 10
	MaxMessageBytes = 1 << 20
	MaxTimeoutMS    = 7 * 24 * 3600 * 1000
	MaxMemoryBytes  = 1 << 40
	MaxMillicores   = 1 << 20
	MaxPids         = 1 << 22
	MaxOutputBytes  = 1 << 40
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// decodeStrict decodes exactly one JSON object, refusing unknown fields, and checks the version.
func decodeStrict(data []byte, v any, version *int) error {
	if len(data) > MaxMessageBytes {
		return invalid("message of %d bytes exceeds %d", len(data), MaxMessageBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return invalid("%v", err)
	}
	if dec.More() {
		return invalid("trailing data after the object")
	}
	if *version != Version {
		return invalid("version %d, want %d", *version, Version)
	}
	return nil
}

// Limits bound one job. Zero means "the runner's default" (for output and timeout: none).
type Limits struct {
	MemoryBytes   int64 `json:"memory_bytes,omitempty"`
	CPUMillicores int64 `json:"cpu_millicores,omitempty"`
	Pids          int64 `json:"pids,omitempty"`
	OutputBytes   int64 `json:"output_bytes,omitempty"`
	TimeoutMS     int64 `json:"timeout_ms,omitempty"`
}

// Validate reports the first limit out of range, naming its field.
func (l Limits) Validate() error {
	for _, f := range []struct {
		name string
		v    int64
		max  int64
	}{
		{"memory_bytes", l.MemoryBytes, MaxMemoryBytes},
		{"cpu_millicores", l.CPUMillicores, MaxMillicores},
		{"pids", l.Pids, MaxPids},
		{"output_bytes", l.OutputBytes, MaxOutputBytes},
		{"timeout_ms", l.TimeoutMS, MaxTimeoutMS},
	} {
		if f.v < 0 || f.v > f.max {
			return invalid("limits.%s %d out of range [0, %d]", f.name, f.v, f.max)
		}
	}
	return nil
}

// Work is one job handed to a runner through WorkStream.
type Work struct {
	V        int               `json:"v"`
	JobID    string            `json:"job_id"`
	Command  string            `json:"command"`
	Cwd      string            `json:"cwd"`
	Env      map[string]string `json:"env,omitempty"`
	Readonly bool              `json:"readonly,omitempty"`
	Pool     string            `json:"pool"`
	Limits   Limits            `json:"limits"`
	// User names the account the job runs as on the runner ("": the runner's default); the runner
	// resolves it and refuses one it does not allow.
	User string `json:"user,omitempty"`
	// Shell is the shell that runs Command with -c: ShellSh, ShellBash, or "" for the runner's default.
	Shell string `json:"shell,omitempty"`
	// Linger keeps the job until its output closes rather than until its shell exits.
	Linger bool `json:"linger,omitempty"`
	// LingerCgroup keeps the job until every process in its cgroup has exited: a daemon that
	// redirected its output stays part of the job (sandbox.Spec.LingerCgroup).
	LingerCgroup bool `json:"linger_cgroup,omitempty"`
	// Stdin gives the job a pipe as its standard input, written through OpStdin; else /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// Claim is a random token the coordinator makes for this job and only the runner that takes the
	// work learns: the runner echoes it in every event and chunk, so that another runner cannot
	// forge them (see ValidClaim).
	Claim string `json:"claim"`
	// SeparateStderr reads standard error apart from standard output and marks its chunks (a
	// monitor's events are stdout lines only); both still go into the one output, in read order.
	SeparateStderr bool `json:"separate_stderr,omitempty"`
	// Source, instead of Command, makes the job's output the messages of a WebSocket the runner
	// reads; the job runs no process.
	Source *Source `json:"source,omitempty"`
	// NotAfter (Unix milliseconds) is when the coordinator stops waiting for the stream to confirm
	// that it queued this work: a publish that is not confirmed by then is refused to the caller.
	// A runner that takes the work later starts it only once the coordinator confirms the job on
	// ConfirmSubject, so that work stored by a publish the coordinator gave up on never runs. 0: no
	// bound.
	NotAfter int64 `json:"not_after,omitempty"`
	// TTY runs the command on a pseudo-terminal of TTYSize (nil: DefaultTTYRows×DefaultTTYCols): its
	// output is what the terminal shows, and OpStdin writes what is typed on it.
	TTY     bool     `json:"tty,omitempty"`
	TTYSize *TTYSize `json:"tty_size,omitempty"`
}

// Expired reports whether the work was taken after its NotAfter, by the clock of the runner.
func (w *Work) Expired(now time.Time) bool {
	return w.NotAfter > 0 && now.UnixMilli() > w.NotAfter
}

// Source is where a job's output comes from when it runs no command.
type Source struct {
	// WS is a ws:// or wss:// URL; each message received is one or more output lines.
	WS string `json:"ws"`
}

// Validate checks the source's URL.
func (s *Source) Validate() error {
	if len(s.WS) > MaxPathBytes {
		return invalid("source.ws is %d bytes, at most %d", len(s.WS), MaxPathBytes)
	}
	u, err := url.Parse(s.WS)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return invalid("source.ws %q must be a ws:// or wss:// URL", s.WS)
	}
	return nil
}

// Shells a job may ask for.
const (
	ShellSh   = "sh"
	ShellBash = "bash"
)

// Validate checks a Work message field by field.
func (w *Work) Validate() error {
	if w.V != Version {
		return invalid("version %d, want %d", w.V, Version)
	}
	if !ValidToken(w.JobID) {
		return invalid("job_id %q is not a token", w.JobID)
	}
	if !ValidToken(w.Pool) {
		return invalid("pool %q is not a token", w.Pool)
	}
	if !ValidClaim(w.Claim) {
		return invalid("claim must be %d..64 characters of [A-Za-z0-9_-]", MinClaimBytes)
	}
	switch {
	case w.Source != nil:
		if w.Command != "" {
			return invalid("a job has a command or a source, not both")
		}
		if w.Readonly {
			return invalid("a readonly job has no network: it cannot have a source")
		}
		if err := w.Source.Validate(); err != nil {
			return err
		}
	case w.Command == "" || len(w.Command) > MaxCommandBytes:
		return invalid("command must be 1..%d bytes", MaxCommandBytes)
	}
	if len(w.Cwd) == 0 || w.Cwd[0] != '/' || len(w.Cwd) > MaxPathBytes {
		return invalid("cwd %q must be an absolute path", w.Cwd)
	}
	if err := ValidateEnv(w.Env); err != nil {
		return err
	}
	if w.User != "" && !ValidUser(w.User) {
		return invalid("user %q is not a user name", w.User)
	}
	if w.Shell != "" && w.Shell != ShellSh && w.Shell != ShellBash {
		return invalid("shell %q is not sh or bash", w.Shell)
	}
	if w.NotAfter < 0 {
		return invalid("not_after %d is negative", w.NotAfter)
	}
	if w.TTYSize != nil {
		if !w.TTY {
			return invalid("tty_size without tty")
		}
		if err := w.TTYSize.Validate("tty_size"); err != nil {
			return err
		}
	}
	if w.TTY && (w.Source != nil || w.SeparateStderr) {
		return invalid("a terminal has one output: tty excludes a source and separate_stderr")
	}
	return w.Limits.Validate()
}

// MinClaimBytes is the shortest claim token: one guessed by a forger must be out of reach.
const MinClaimBytes = 16

// ValidClaim reports whether s can be a claim token: a ValidToken of at least MinClaimBytes.
func ValidClaim(s string) bool {
	return len(s) >= MinClaimBytes && ValidToken(s)
}

// MaxUserBytes bounds a user name.
const MaxUserBytes = 32

// ValidUser reports whether s can be a user name: 1–32 characters of [A-Za-z0-9_.-], not starting
// with '-' or '.', or a decimal uid.
func ValidUser(s string) bool {
	if len(s) == 0 || len(s) > MaxUserBytes || s[0] == '-' || s[0] == '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// ValidateEnv checks the size and shape of a job's environment.
func ValidateEnv(env map[string]string) error {
	if len(env) > MaxEnvEntries {
		return invalid("env has %d entries, at most %d", len(env), MaxEnvEntries)
	}
	total := 0
	for k, v := range env {
		if k == "" || len(k) > MaxEnvKeyBytes || bytes.ContainsAny([]byte(k), "=\x00") {
			return invalid("env key %q must be 1..%d bytes without '=' or NUL", k, MaxEnvKeyBytes)
		}
		if bytes.IndexByte([]byte(v), 0) >= 0 {
			return invalid("env value of %q contains NUL", k)
		}
		total += len(k) + len(v) + 2
	}
	if total > MaxEnvBytes {
		return invalid("env is %d bytes, at most %d", total, MaxEnvBytes)
	}
	return nil
}

// DecodeWork decodes and validates a Work message.
func DecodeWork(data []byte) (*Work, error) {
	var w Work
	if err := decodeStrict(data, &w, &w.V); err != nil {
		return nil, err
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	return &w, nil
}

// Event kinds.
const (
	// EventAccepted: a runner took the work (acked it) and is about to start it.
	EventAccepted = "accepted"
	// EventStarted: the process runs, in its cgroup.
	EventStarted = "started"
	// EventExited: the process and everything in its cgroup ended; all output was published before it.
	EventExited = "exited"
)

// Reasons a job ended, as the API names them.
const (
	ReasonExit         = "exit"
	ReasonSignal       = "signal"
	ReasonKilled       = "killed"
	ReasonTimeout      = "timeout"
	ReasonOOM          = "oom"
	ReasonOutputLimit  = "output_limit"
	ReasonLost         = "lost"
	ReasonSessionEnded = "session_ended"
	ReasonStartFailed  = "start_failed"
)

// Usage is what a job consumed, read from its cgroup.
type Usage struct {
	CPUMS           int64  `json:"cpu_ms"`
	MemoryPeakBytes uint64 `json:"memory_peak_bytes"`
}

// Event is a state change of one job, published by its runner on StateSubject.
type Event struct {
	V      int    `json:"v"`
	Kind   string `json:"kind"`
	JobID  string `json:"job_id"`
	Runner string `json:"runner"`
	// Claim is the job's Work.Claim.
	Claim string    `json:"claim"`
	Time  time.Time `json:"time"`
	// Started.
	Pid int `json:"pid,omitempty"`
	// Exited.
	ExitCode    *int   `json:"exit_code,omitempty"`
	Signal      int    `json:"signal,omitempty"`
	Reason      string `json:"reason,omitempty"`
	Error       string `json:"error,omitempty"`
	OutputBytes int64  `json:"output_bytes,omitempty"`
	Usage       *Usage `json:"usage,omitempty"`
	// Activity (EventActivity): Seq orders a job's activity events; InputSince is when its
	// processes began to wait for input (nil: they do not); Ports are where they listen.
	Seq        int64      `json:"seq,omitempty"`
	InputSince *time.Time `json:"input_since,omitempty"`
	Ports      []Port     `json:"ports,omitempty"`
	// Stages (accepted, started and exited events) say when the job passed each step on the runner.
	// Optional: an event without them is still valid.
	Stages *Stages `json:"stages,omitempty"`
}

// Stages are when a job passed each step on its runner, in µs since the runner took its work, by
// the runner host's CLOCK_MONOTONIC (the stamps of sandbox.Process.Stages, which the kernel gave,
// less the runner's own reading when it took the work): offsets from one clock, so that no clock
// of the runner need agree with the coordinator's. 0: not passed yet, or not reported (a job
// without a process). The coordinator places them on its own clock through SentUS (Job.Timings).
type Stages struct {
	// CgroupUS: the job's cgroup was ready (its init step joined it, or a warm one's got its limits).
	CgroupUS int64 `json:"cgroup_us,omitempty"`
	// ExecUS: the job's process was about to execute its program.
	ExecUS int64 `json:"exec_us,omitempty"`
	// ExitUS: the job's program exited (exited events).
	ExitUS int64 `json:"exit_us,omitempty"`
	// SentUS: the runner made this event to publish it.
	SentUS int64 `json:"sent_us"`
}

// MaxStageUS bounds a stage: a week, beyond MaxTimeoutMS.
const MaxStageUS = 8 * 24 * 3600 * 1_000_000

// Validate checks that every stage is in range and none comes after the event was sent.
func (s *Stages) Validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"cgroup_us", s.CgroupUS}, {"exec_us", s.ExecUS}, {"exit_us", s.ExitUS}, {"sent_us", s.SentUS}} {
		if f.v < 0 || f.v > MaxStageUS {
			return invalid("stages.%s %d out of range [0, %d]", f.name, f.v, MaxStageUS)
		}
		if f.v > s.SentUS {
			return invalid("stages.%s %d is after stages.sent_us %d", f.name, f.v, s.SentUS)
		}
	}
	return nil
}

var reasons = map[string]bool{
	ReasonExit: true, ReasonSignal: true, ReasonKilled: true, ReasonTimeout: true, ReasonOOM: true,
	ReasonOutputLimit: true, ReasonStartFailed: true,
	// A runner that could not reach NATS for its deadline kills its jobs as lost (self-fencing).
	ReasonLost: true,
}

// Validate checks an Event for its kind.
func (e *Event) Validate() error {
	if e.V != Version {
		return invalid("version %d, want %d", e.V, Version)
	}
	if !ValidToken(e.JobID) {
		return invalid("job_id %q is not a token", e.JobID)
	}
	if !ValidToken(e.Runner) {
		return invalid("runner %q is not a token", e.Runner)
	}
	if !ValidClaim(e.Claim) {
		return invalid("claim must be %d..64 characters of [A-Za-z0-9_-]", MinClaimBytes)
	}
	if e.Time.IsZero() {
		return invalid("time is missing")
	}
	if e.Stages != nil {
		if e.Kind != EventAccepted && e.Kind != EventStarted && e.Kind != EventExited {
			return invalid("a %s event has no stages", e.Kind)
		}
		if err := e.Stages.Validate(); err != nil {
			return err
		}
	}
	switch e.Kind {
	case EventAccepted:
	case EventStarted:
		// 0: the job has no process of its own (a WebSocket source).
		if e.Pid < 0 {
			return invalid("started event has pid %d", e.Pid)
		}
	case EventActivity:
		return e.validateActivity()
	case EventExited:
		if !reasons[e.Reason] {
			return invalid("reason %q is not one a runner reports", e.Reason)
		}
		if (e.Reason == ReasonExit || e.Reason == ReasonSignal) && e.ExitCode == nil {
			return invalid("exited event with reason %s needs exit_code", e.Reason)
		}
		if e.ExitCode != nil && (*e.ExitCode < 0 || *e.ExitCode > 255) {
			return invalid("exit_code %d out of range", *e.ExitCode)
		}
		if e.Signal < 0 || e.Signal > 64 {
			return invalid("signal %d out of range", e.Signal)
		}
		if e.OutputBytes < 0 {
			return invalid("output_bytes %d is negative", e.OutputBytes)
		}
		if len(e.Error) > 4096 {
			return invalid("error is %d bytes, at most 4096", len(e.Error))
		}
	default:
		return invalid("kind %q is unknown", e.Kind)
	}
	return nil
}

// MsgID is the JetStream de-duplication id of the event: one per job and kind. It holds the claim,
// which a forger does not know, so that a forged message cannot take the id of a real one first and
// have the real one dropped as a duplicate.
// An activity event is one of many of its job: its seq is in its id.
func (e *Event) MsgID() string {
	if e.Kind == EventActivity {
		return e.JobID + ":" + e.Claim + ":" + e.Kind + ":" + strconv.FormatInt(e.Seq, 10)
	}
	return e.JobID + ":" + e.Claim + ":" + e.Kind
}

// DecodeEvent decodes and validates an Event.
func DecodeEvent(data []byte) (*Event, error) {
	var e Event
	if err := decodeStrict(data, &e, &e.V); err != nil {
		return nil, err
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return &e, nil
}

// Chunk is a piece of a job's output (stdout and stderr interleaved), published on OutputSubject with
// the raw bytes as the payload. The subject names the runner, the job and the wire version; the
// headers of sbx's own are the byte offset and the claim (every header costs the server parsing on
// the hottest path). Writing a chunk twice is harmless.
type Chunk struct {
	// Runner is the runner the subject names: with NATS auth, the one that published it.
	Runner string
	JobID  string
	Claim  string
	Offset int64
	Data   []byte
	// Stderr marks bytes read from standard error's own pipe (Work.SeparateStderr); otherwise the
	// chunk is stdout, or both interleaved.
	Stderr bool
}

// Headers returns the NATS headers of the chunk: its offset, its claim, its de-duplication id (which
// holds the claim, as Event.MsgID does) and, for standard error's bytes, its stream.
func (c *Chunk) Headers() map[string][]string {
	off := strconv.FormatInt(c.Offset, 10)
	h := map[string][]string{
		HeaderOffset: {off},
		HeaderClaim:  {c.Claim},
		HeaderMsgID:  {c.JobID + ":" + c.Claim + ":o:" + off},
	}
	if c.Stderr {
		h[HeaderStream] = []string{StreamStderr}
	}
	return h
}

// DecodeChunk validates a chunk from its subject, headers and payload. The payload is not copied.
func DecodeChunk(subject string, headers map[string][]string, data []byte) (*Chunk, error) {
	runnerID, job, kind, ok := ParseEventSubject(subject)
	if !ok || kind != KindOutput {
		return nil, invalid("subject %q is not an output subject", subject)
	}
	var claim string
	if v := headers[HeaderClaim]; len(v) > 0 {
		claim = v[0]
	}
	if !ValidClaim(claim) {
		return nil, invalid("chunk claim must be %d..64 characters of [A-Za-z0-9_-]", MinClaimBytes)
	}
	var off string
	if v := headers[HeaderOffset]; len(v) > 0 {
		off = v[0]
	}
	offset, err := strconv.ParseInt(off, 10, 64)
	if err != nil || offset < 0 || offset > MaxOutputBytes {
		return nil, invalid("chunk offset %q is not a byte offset", off)
	}
	if len(data) == 0 || len(data) > MaxChunkBytes {
		return nil, invalid("chunk of %d bytes, want 1..%d", len(data), MaxChunkBytes)
	}
	var stderr bool
	if v := headers[HeaderStream]; len(v) > 0 {
		if v[0] != StreamStderr {
			return nil, invalid("chunk stream %q is not %q", v[0], StreamStderr)
		}
		stderr = true
	}
	return &Chunk{Runner: runnerID, JobID: job, Claim: claim, Offset: offset, Data: data, Stderr: stderr}, nil
}

// Control operations.
const (
	OpKill   = "kill"
	OpSignal = "signal"
	OpPing   = "ping"
	// OpStdin writes Data to the job's standard input, then closes it when Close is set.
	OpStdin = "stdin"
	// OpConfirm asks the coordinator, on ConfirmSubject, whether the job of an expired Work message
	// is still to start: ReplyOK when it is queued there, ReplyUnknownJob when it was refused or ended.
	OpConfirm = "confirm"
)

// MaxStdinBytes bounds the input one OpStdin request carries.
const MaxStdinBytes = 64 << 10

// Control is a request to the runner that owns a job, on ControlSubject.
type Control struct {
	V     int    `json:"v"`
	Op    string `json:"op"`
	JobID string `json:"job_id,omitempty"`
	// Signal names the signal for OpSignal ("INT", "HUP", ...).
	Signal string `json:"signal,omitempty"`
	// Data and Close are OpStdin's: bytes for the job's input, and whether to close it after them.
	Data  []byte `json:"data,omitempty"`
	Close bool   `json:"close,omitempty"`
	// Size is OpResize's: the terminal's new size.
	Size *TTYSize `json:"size,omitempty"`
}

// signals are the signals a control request may name, with their numbers on Linux.
var signals = map[string]int{"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "TERM": 15, "CONT": 18, "STOP": 19}

// Signal returns the number of a signal a control request may name, and whether it may.
func Signal(name string) (int, bool) {
	n, ok := signals[name]
	return n, ok
}

// Validate checks a Control request.
func (c *Control) Validate() error {
	if c.V != Version {
		return invalid("version %d, want %d", c.V, Version)
	}
	switch c.Op {
	case OpPing:
		return nil
	case OpKill, OpConfirm:
	case OpStdin:
		if len(c.Data) > MaxStdinBytes {
			return invalid("stdin data of %d bytes, at most %d", len(c.Data), MaxStdinBytes)
		}
	case OpResize:
		if c.Size == nil {
			return invalid("resize without size")
		}
		if err := c.Size.Validate("size"); err != nil {
			return err
		}
	case OpSignal:
		if _, ok := Signal(c.Signal); !ok {
			return invalid("signal %q is not one of HUP INT QUIT KILL USR1 USR2 TERM CONT STOP", c.Signal)
		}
	default:
		return invalid("op %q is unknown", c.Op)
	}
	if !ValidToken(c.JobID) {
		return invalid("job_id %q is not a token", c.JobID)
	}
	return nil
}

// DecodeControl decodes and validates a Control request.
func DecodeControl(data []byte) (*Control, error) {
	var c Control
	if err := decodeStrict(data, &c, &c.V); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Control reply codes.
const (
	// ReplyOK: done.
	ReplyOK = "ok"
	// ReplyUnknownJob: the runner has no such job running (it ended, or never ran here).
	ReplyUnknownJob = "unknown_job"
	// ReplyInvalid: the request did not decode.
	ReplyInvalid = "invalid"
	// ReplyRefused: the job cannot do what was asked (its input is closed, or it reads none).
	ReplyRefused = "refused"
)

// ControlReply answers a Control request.
type ControlReply struct {
	V       int    `json:"v"`
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

// DecodeControlReply decodes and validates a ControlReply.
func DecodeControlReply(data []byte) (*ControlReply, error) {
	var r ControlReply
	if err := decodeStrict(data, &r, &r.V); err != nil {
		return nil, err
	}
	switch r.Code {
	case ReplyOK, ReplyUnknownJob, ReplyInvalid, ReplyRefused:
	default:
		return nil, invalid("reply code %q is unknown", r.Code)
	}
	return &r, nil
}

// Heartbeat announces a runner and its capacity, every few seconds, on HeartbeatSubject.
type Heartbeat struct {
	V       int    `json:"v"`
	Runner  string `json:"runner"`
	Pool    string `json:"pool"`
	Slots   int    `json:"slots"`
	Running int    `json:"running"`
	// Readonly is the verdict of the runner's sandbox probe; ReadonlyReason says why when false.
	Readonly       bool              `json:"readonly"`
	ReadonlyReason string            `json:"readonly_reason,omitempty"`
	Cgroup         string            `json:"cgroup"`
	Labels         map[string]string `json:"labels,omitempty"`
	Version        string            `json:"version"`
	// Draining: the runner was asked to stop; it takes no more work and lets its jobs finish.
	Draining bool `json:"draining,omitempty"`
	// Jobs are the ids of the jobs the runner runs (or is starting): the coordinator has it kill
	// any that it no longer considers running there (marked lost, ended, unknown), so that a job
	// is never both ended and running.
	Jobs []string `json:"jobs,omitempty"`
	// Boot is when this runner process started: a new Boot means every job of the old one is lost.
	Boot time.Time `json:"boot"`
	Time time.Time `json:"time"`
}

// DecodeHeartbeat decodes and validates a Heartbeat.
func DecodeHeartbeat(data []byte) (*Heartbeat, error) {
	var h Heartbeat
	if err := decodeStrict(data, &h, &h.V); err != nil {
		return nil, err
	}
	if !ValidToken(h.Runner) || !ValidToken(h.Pool) {
		return nil, invalid("runner %q and pool %q must be tokens", h.Runner, h.Pool)
	}
	if h.Slots < 1 || h.Running < 0 || h.Running > h.Slots {
		return nil, invalid("slots %d and running %d are inconsistent", h.Slots, h.Running)
	}
	if h.Time.IsZero() || h.Boot.IsZero() {
		return nil, invalid("time and boot are required")
	}
	if len(h.Jobs) > MaxHeartbeatJobs {
		return nil, invalid("jobs lists %d ids, at most %d", len(h.Jobs), MaxHeartbeatJobs)
	}
	for _, id := range h.Jobs {
		if !ValidToken(id) {
			return nil, invalid("jobs: %q is not a token", id)
		}
	}
	return &h, nil
}

// MaxHeartbeatJobs bounds Heartbeat.Jobs: a runner has at most this many slots. 16384 ids of 13
// characters are about 270 KB of JSON, within MaxMessageBytes.
const MaxHeartbeatJobs = 16384

// DefaultRunnerDeadline is how long a runner may go unheard before the coordinator marks its jobs
// lost (sbx's --runner-deadline, the same on both sides). A runner derives its heartbeat interval
// (HeartbeatInterval) and its fence (RunnerFenceAfter) from it, so that its jobs are dead by the time
// they are declared lost: 8 s gives a heartbeat every 2 s and a fence at 6 s, and a runner killed
// with kill -9 is reported lost within 10 s.
const DefaultRunnerDeadline = 8 * time.Second

// MinRunnerDeadline is the shortest runner deadline a coordinator or runner accepts: below it a
// heartbeat interval (a quarter of it) is shorter than a round trip to NATS under load.
const MinRunnerDeadline = 100 * time.Millisecond

// HeartbeatInterval is the time between a runner's heartbeats for a runner deadline: 2 s, or a
// quarter of the deadline when that is shorter, so that one late heartbeat is not a missed deadline.
func HeartbeatInterval(deadline time.Duration) time.Duration {
	return min(2*time.Second, deadline/4)
}

// RunnerFenceAfter is how long a runner's jobs may go on without a heartbeat that NATS confirmed
// before its fence kills them: one heartbeat interval before the deadline, so that they are dead when
// the coordinator, which heard that heartbeat no later than the runner's confirmation, declares them
// lost.
func RunnerFenceAfter(deadline time.Duration) time.Duration {
	return deadline - HeartbeatInterval(deadline)
}

// Encode marshals any message of this package. Marshalling these types cannot fail.
func Encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("proto: encode %T: %v", v, err))
	}
	return b
}
