package coordinator

import "time"

// What the coordinator and the runners tell each other, in the domain's own types: the Dispatcher
// port takes and returns them, and the Service's Handle methods take them. The wire's messages are
// proto's; coordinator/natsbus translates between the two, so that a new wire version changes the
// adapter and not the domain. The string fields whose values the runner and the coordinator share
// (an event's kind and reason, a request's op, a reply's code) hold proto's constants.

// Work is one job handed to a runner: what it runs, where, and what it may use.
type Work struct {
	JobID    string
	Command  string
	Cwd      string
	Env      map[string]string
	Readonly bool
	Pool     string
	Limits   Limits
	// User names the account the job runs as on the runner ("": the runner's default).
	User string
	// Shell runs Command with -c: "sh", "bash", or "" for the runner's default.
	Shell        string
	Linger       bool
	LingerCgroup bool
	Stdin        bool
	// Claim is the job's claim token (Job.Claim): only the runner that takes the work learns it.
	Claim string
	// SeparateStderr has the runner read standard error apart and mark its chunks (Chunk.Stderr).
	SeparateStderr bool
	// Source, instead of Command, makes the job's output a WebSocket's messages.
	Source  *Source
	TTY     bool
	TTYSize *TTYSize
}

// Control is a request to the runner that runs a job. Op is one of proto's Op constants.
type Control struct {
	Op    string
	JobID string
	// Signal names the signal of a signal request ("INT", "HUP", ...).
	Signal string
	// Data and Close are a stdin request's: bytes for the job's input, and whether to close it after.
	Data  []byte
	Close bool
	// Size is a resize request's: the terminal's new size.
	Size *TTYSize
}

// ControlReply is a runner's answer to a Control request. Code is one of proto's Reply constants.
type ControlReply struct {
	Code    string
	Message string
}

// Event is a state change of one job, reported by the runner that has it. Kind is one of proto's
// Event constants, Reason one of its Reason constants.
type Event struct {
	Kind  string
	JobID string
	// Runner is the runner that sent the event, as the adapter knows it.
	Runner string
	// Claim is the one the runner learnt from the job's Work.
	Claim string
	Time  time.Time
	// Started.
	Pid int
	// Exited.
	ExitCode    *int
	Signal      int
	Reason      string
	Error       string
	OutputBytes int64
	Usage       *Usage
	// Activity: Seq orders a job's activity events; InputSince is when its processes began to wait
	// for input (nil: they do not), by the runner's clock; Ports are where they listen.
	Seq        int64
	InputSince *time.Time
	Ports      []Port
	// Stages (accepted, started and exited events): when the job passed each step on the runner.
	Stages *Stages
}

// inputFor is how long the job has been waiting for input by the event's own clock (0 when it is
// not): the runner's and the coordinator's clocks need not agree.
func (e *Event) inputFor() time.Duration {
	if e.InputSince == nil {
		return 0
	}
	return max(0, e.Time.Sub(*e.InputSince))
}

// Stages are when a job passed each step on its runner, in µs since the runner took its work, on
// the runner's monotonic clock (0: not passed, or not reported). SentUS is when the runner made
// the event, on the same clock: the coordinator places the others on its own clock through it
// (Timings).
type Stages struct {
	CgroupUS int64
	ExecUS   int64
	ExitUS   int64
	SentUS   int64
}

// Chunk is a piece of a job's output at its byte offset.
type Chunk struct {
	// Runner is the runner that sent the chunk, as the adapter knows it.
	Runner string
	JobID  string
	Claim  string
	Offset int64
	Data   []byte
	// Stderr marks bytes read from standard error's own pipe (Work.SeparateStderr).
	Stderr bool
}

// Heartbeat is a runner announcing itself and its capacity.
type Heartbeat struct {
	Runner  string
	Pool    string
	Slots   int
	Running int
	// Readonly is the verdict of the runner's sandbox probe; ReadonlyReason says why when false.
	Readonly       bool
	ReadonlyReason string
	Cgroup         string
	Labels         map[string]string
	Version        string
	// Draining: the runner takes no more work and lets its jobs finish.
	Draining bool
	// Jobs are the ids of the jobs the runner runs (or is starting): fence has it kill those
	// the coordinator no longer considers running there.
	Jobs []string
	// Boot is when the runner process started: a new one means the old one's jobs are lost.
	Boot time.Time
}
