package coordinator

import (
	"log/slog"
	"time"

	"github.com/sbx-dev/sbx/proto"
)

// Config holds the coordinator's settings; the zero value of each field means its default.
type Config struct {
	// CheckCwd makes Start refuse a cwd that does not exist here: set it when the coordinator shares
	// the runners' file system (sbx serve).
	CheckCwd bool
	// DefaultOutputBytes caps a job's output when the request sets no cap (default 1 GiB).
	DefaultOutputBytes int64
	// RunnerDeadline is how long a runner may stay silent before it is gone and its jobs lost
	// (proto.DefaultRunnerDeadline, 8 s).
	RunnerDeadline time.Duration
	// StartDeadline is how long a taken job may wait for its start event before it is lost (60 s).
	StartDeadline time.Duration
	// HeaderInterval is how often a running job's running_for_ms is rewritten (5 s).
	HeaderInterval time.Duration
	// CheckInterval is how often silent runners and jobs that never started are looked for (1 s).
	CheckInterval time.Duration
	// NotifyInterval is how often debounce windows, stalls and session leases are looked at (100 ms).
	NotifyInterval time.Duration
	// StallAfter is how long output must stay unchanged before a prompt-like last line notifies (30 s).
	StallAfter time.Duration
	// InputStallAfter is how long a job's processes must all wait for input, as its runner sees them
	// in /proc, before the job's stall is notified whatever its last line (10 s).
	InputStallAfter time.Duration
	// MinDebounce is the shortest notify_on_output debounce accepted (5 s); tests lower it.
	MinDebounce time.Duration
	// MonitorMaxLines lines per MonitorWindow are the most a monitor may print; more stops it
	// (200 lines per 10 s).
	MonitorMaxLines int
	MonitorWindow   time.Duration
	// MonitorTimeout is a monitor's timeout unless it is persistent or sets its own (30 min).
	MonitorTimeout time.Duration
	// OutputBudget bounds the output stored for all jobs together, the ended ones kept and the
	// running ones (DefaultOutputBudget): at it, new jobs are refused (EOUTPUTBUDGET) and a running
	// job that writes more is stopped, ending with reason output_limit. It should exceed RetainBytes,
	// which retention brings the ended jobs' output back under.
	OutputBudget int64
	// MinFreeBytes is the free space the data disk keeps (DefaultMinFreeBytes): below it new jobs
	// are refused (EDISKLOW). Negative: not checked.
	MinFreeBytes int64

	// RetainAge is how long an ended job (its record and output) and a notification are kept (7 days);
	// RetainBytes bounds the output of the ended jobs kept (10 GiB): past it the oldest go first.
	// RetentionInterval is how often they are applied (1 min).
	RetainAge         time.Duration
	RetainBytes       int64
	RetentionInterval time.Duration

	// Idempotency keeps the Idempotency-Keys of starts for every coordinator of the fleet (nil:
	// StartOnce refuses, EUNAVAILABLE). IdempotencyWait is how long a start that finds its key
	// reserved by a start still under way waits for its job (10 s); AbandonAfter is the age at
	// which such a reservation was abandoned, its coordinator gone between reserving and queuing,
	// and is taken over (1 min).
	Idempotency     IdempotencyStore
	IdempotencyWait time.Duration
	AbandonAfter    time.Duration

	Now    func() time.Time
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.IdempotencyWait == 0 {
		c.IdempotencyWait = 10 * time.Second
	}
	if c.AbandonAfter == 0 {
		c.AbandonAfter = time.Minute
	}
	if c.DefaultOutputBytes == 0 {
		c.DefaultOutputBytes = 1 << 30
	}
	if c.RunnerDeadline == 0 {
		c.RunnerDeadline = proto.DefaultRunnerDeadline
	}
	if c.StartDeadline == 0 {
		c.StartDeadline = 60 * time.Second
	}
	if c.HeaderInterval == 0 {
		c.HeaderInterval = 5 * time.Second
	}
	if c.CheckInterval == 0 {
		c.CheckInterval = time.Second
	}
	if c.NotifyInterval == 0 {
		c.NotifyInterval = 100 * time.Millisecond
	}
	if c.StallAfter == 0 {
		c.StallAfter = 30 * time.Second
	}
	if c.InputStallAfter == 0 {
		c.InputStallAfter = 10 * time.Second
	}
	if c.MinDebounce == 0 {
		c.MinDebounce = DefaultDebounce
	}
	if c.MonitorMaxLines == 0 {
		c.MonitorMaxLines = 200
	}
	if c.MonitorWindow == 0 {
		c.MonitorWindow = 10 * time.Second
	}
	if c.MonitorTimeout == 0 {
		c.MonitorTimeout = 30 * time.Minute
	}
	if c.RetainAge == 0 {
		c.RetainAge = DefaultRetainAge
	}
	if c.RetainBytes == 0 {
		c.RetainBytes = DefaultRetainBytes
	}
	if c.RetentionInterval == 0 {
		c.RetentionInterval = time.Minute
	}
	if c.OutputBudget == 0 {
		c.OutputBudget = DefaultOutputBudget
	}
	if c.MinFreeBytes == 0 {
		c.MinFreeBytes = DefaultMinFreeBytes
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}
