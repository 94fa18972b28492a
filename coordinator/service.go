package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"sync"
	"sync/atomic"
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

// Service is the coordinator: it starts jobs, applies the runners' events to them and answers
// questions about them. Events are applied by one goroutine (the event consumer); API calls come
// concurrently.
type Service struct {
	cfg   Config
	jobs  Store
	out   OutputStore
	disp  Dispatcher
	start time.Time

	sessions *sessionBook
	fleet    *fleet
	budget   *retention

	mu      sync.Mutex
	live    map[string]*liveJob // every job not yet ended
	runners map[string]*Runner
	stats   Stats

	// scans are the waits' output scanners by job and pattern (scan.go); scannedBytes counts the
	// output they read, for Stats.
	scanMu       sync.Mutex
	scans        map[scanKey]*scanner
	scannedBytes atomic.Int64
}

// liveJob is the in-memory state of a job that has not ended.
type liveJob struct {
	job *Job
	// size is the length of the body written without a gap: readers never see past it.
	size int64
	// ahead holds chunks written beyond a gap (offset → end), which a late chunk may close.
	ahead   map[int64]int64
	changed chan struct{} // closed and replaced at every change
	// exitSeen is when the exit event first arrived while output was still missing.
	exitSeen time.Time

	// observers counts the callers waiting for the end right now (a blocking start, a wait). An end
	// applied while one waits is observed: no finished notification is stored, unless every
	// observer then returns without reporting it (endSeen stays false).
	observers int
	endSeen   bool
	// ownerKill: the job's own session asked for its kill, so its end is observed (KillFrom).
	ownerKill bool
	// sessionEnded: the job's session ended, so its end is session_ended. quiet: it notifies nothing.
	sessionEnded bool
	quiet        bool
	watch        *outputWatch // nil when nothing watches the output
	// errSpans are the byte ranges [off, end) of the body that came from stderr's own pipe (a
	// monitor reads it apart), kept until the watch has seen them.
	errSpans []span
	// lastGrowth is when the body last grew; stallChecked is set once the current quiet spell was
	// looked at for a prompt, stallNotified once a stall was notified (once per job).
	lastGrowth    time.Time
	stallChecked  bool
	stallNotified bool
	// budgetCut: the job was stopped because the output of all jobs reached OutputBudget; it ends
	// with reason output_limit.
	budgetCut bool
	// inputSince is when the job's processes began to wait for input, by this coordinator's clock
	// (zero: they do not), from the runner's activity events, the latest of which is activitySeq;
	// portsSeen are the ports already notified.
	inputSince  time.Time
	activitySeq int64
	portsSeen   map[string]bool
	// clock is what this coordinator measured of the job's stages (Job.Timings).
	clock clock
}

// span is a byte range [off, end) of a job's output.
type span struct{ off, end int64 }

// feedWatch hands the body's bytes [from, from+len(data)) to the watch, each run of them as the
// stream it came from, and forgets the stderr spans the watch has now seen.
func (l *liveJob) feedWatch(data []byte, from int64, now time.Time) {
	for len(data) > 0 {
		end := from + int64(len(data))
		stderr, until := false, end
		for _, sp := range l.errSpans {
			if sp.off <= from && from < sp.end {
				stderr, until = true, min(end, sp.end)
				break
			}
			if sp.off > from && sp.off < until {
				until = sp.off
			}
		}
		n := until - from
		l.watch.feed(data[:n], stderr, now)
		data, from = data[n:], until
	}
	kept := l.errSpans[:0]
	for _, sp := range l.errSpans {
		if sp.end > l.size {
			kept = append(kept, sp)
		}
	}
	l.errSpans = kept
}

// wrote records a chunk written at [off, end) and reports whether the gap-free body grew.
func (l *liveJob) wrote(off, end int64) bool {
	if off > l.size {
		if l.ahead == nil {
			l.ahead = map[int64]int64{}
		}
		l.ahead[off] = max(l.ahead[off], end)
		return false
	}
	old := l.size
	l.size = max(l.size, end)
	for grown := true; grown; {
		grown = false
		for o, e := range l.ahead {
			if o <= l.size {
				l.size = max(l.size, e)
				delete(l.ahead, o)
				grown = true
			}
		}
	}
	return l.size > old
}

// wake closes the job's change channel, waking whoever waits for its next change, and makes the next one.
func (l *liveJob) wake() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// New returns a Service. It loads the unfinished jobs of an earlier life from the store.
func New(ctx context.Context, cfg Config, jobs Store, out OutputStore, disp Dispatcher) (*Service, error) {
	cfg.setDefaults()
	s := &Service{
		cfg: cfg, jobs: jobs, out: out, disp: disp, start: cfg.Now(),
		live:  map[string]*liveJob{},
		scans: map[scanKey]*scanner{},
		stats: Stats{JobsEnded: map[Status]int64{}, Forged: map[string]int64{}},
	}
	s.fleet = newFleet(&s.cfg, disp, s.start)
	var err error
	if s.sessions, err = newSessionBook(ctx, &s.cfg, jobs); err != nil {
		return nil, err
	}
	now := cfg.Now()
	unfinished, err := jobs.UnfinishedJobs(ctx)
	if err != nil {
		return nil, err
	}
	var live int64
	for _, j := range unfinished {
		size, err := out.Size(j.ID)
		if err != nil {
			return nil, err
		}
		// Output matching resumes at the end of what is on disk: what was before was matched in
		// the earlier life.
		s.live[j.ID] = &liveJob{job: j, size: size, changed: make(chan struct{}), watch: newOutputWatch(j, &cfg), lastGrowth: now}
		live += size
	}
	if s.budget, err = newRetention(ctx, &s.cfg, jobs, out, live); err != nil {
		return nil, err
	}
	return s, nil
}

// RoomForJob returns why a new job may not start for lack of disk, or nil: the output stored for
// all jobs reached OutputBudget, or the data disk has less than MinFreeBytes free. Start checks
// it; /readyz reports it.
func (s *Service) RoomForJob() error {
	return s.budget.room()
}

// StartResult is the reply to a start.
type StartResult struct {
	Job *Job
	// Output is the output's end: all of it, or (OutputTruncated) its last MaxReplyOutput bytes at
	// most, from a line's start. OutputBytes is the whole output's size.
	Output          []byte
	OutputBytes     int64
	OutputTruncated bool
	// OutputLines counts Output's lines, TotalLines the whole output's.
	OutputLines, TotalLines int
	Backgrounded            bool
	// Replayed: the start repeated an earlier one's Idempotency-Key, and Job is that start's job.
	Replayed bool
	// Accepted is when this coordinator accepted the start, the origin of Job.Timings, for the
	// reply's own stage (reply_us); zero for a replayed start.
	Accepted time.Time
}

// Start validates the request, records the job, queues it and, when asked, waits for it to end.
func (s *Service) Start(ctx context.Context, req StartRequest) (*StartResult, error) {
	return s.startJob(ctx, req, nil)
}

// startJob is Start; queued, when set, is called with the job's id once the job is queued, before
// the wait of BlockUntil.
func (s *Service) startJob(ctx context.Context, req StartRequest, queued func(id string)) (*StartResult, error) {
	// The origin of the job's Timings: the real clock, with its monotonic reading, whatever cfg.Now is.
	accepted := time.Now()
	if err := req.validate(s.cfg.CheckCwd, s.cfg.MinDebounce); err != nil {
		return nil, err
	}
	if err := s.RoomForJob(); err != nil {
		return nil, err
	}
	if req.Readonly {
		if err := s.fleet.readonlyAvailable(req.Pool); err != nil {
			return nil, err
		}
	}
	now := s.cfg.Now()
	job := &Job{
		ID: newJobID(now), Session: req.Session, Title: req.Title, Command: req.Command, Source: req.Source, Cwd: req.Cwd,
		Readonly: req.Readonly, User: req.User, Shell: req.Shell, Linger: req.Linger, LingerCgroup: req.LingerCgroup, Stdin: req.Stdin, Pool: req.Pool, Status: StatusQueued, CreatedAt: now, Limits: req.Limits,
		TTY: req.TTY, TTYSize: req.TTYSize,
		Notify: req.NotifyOnOutput, Monitor: req.Monitor, Persistent: req.Persistent,
		NotificationFormat: req.NotificationFormat, ToolCallID: req.ToolCallID, Claim: newClaim(),
	}
	if job.Limits.OutputBytes == 0 {
		job.Limits.OutputBytes = s.cfg.DefaultOutputBytes
	}
	if job.Monitor && !job.Persistent && job.Limits.TimeoutMS == 0 {
		job.Limits.TimeoutMS = s.cfg.MonitorTimeout.Milliseconds()
	}
	job.OutputPath = s.out.Path(job.ID)
	work := &Work{
		JobID: job.ID, Command: job.Command, Cwd: job.Cwd, Env: req.Env,
		Readonly: job.Readonly, User: job.User, Shell: job.Shell, Linger: job.Linger, LingerCgroup: job.LingerCgroup, Stdin: job.Stdin, Pool: job.Pool, Limits: job.Limits,
		Claim:          job.Claim,
		SeparateStderr: job.Monitor && !job.TTY, Source: job.Source, // a terminal has one output
		TTY: job.TTY, TTYSize: job.TTYSize,
	}

	s.mu.Lock()
	if err := s.sessions.open(ctx, job.Session); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	if err := s.jobs.PutJob(ctx, job); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	l := &liveJob{job: job, changed: make(chan struct{}), watch: newOutputWatch(job, &s.cfg), lastGrowth: now, clock: clock{accepted: accepted}}
	l.clock.stored = l.clock.since(time.Now()) // stored with the job's next change, as WorkSeq
	l.retimeLocked()
	if req.BlockUntil > 0 {
		// The caller observes from now on: a job that ends before the wait below begins is seen too.
		l.observers++
	}
	s.live[job.ID] = l
	s.stats.JobsStarted++
	s.mu.Unlock()

	seq, err := s.disp.Dispatch(ctx, work)
	if err != nil {
		s.mu.Lock()
		job.end(s.cfg.Now(), proto.ReasonStartFailed, nil)
		job.Error = "The job could not be queued: " + err.Error()
		l.quiet = true // the caller gets the error instead
		s.finishLocked(ctx, l)
		s.mu.Unlock()
		return nil, Errorf(EUNAVAILABLE, "The job could not be queued; is NATS reachable?")
	}
	s.mu.Lock()
	job.WorkSeq = seq // persisted with the job's next change
	l.clock.published = l.clock.since(time.Now())
	l.retimeLocked()
	s.mu.Unlock()
	if queued != nil {
		queued(job.ID)
	}

	res := &StartResult{Job: s.snapshot(job.ID, job), Accepted: accepted}
	if req.BlockUntil > 0 {
		w, err := s.wait(ctx, job.ID, l, req.BlockUntil, WaitCond{})
		if err != nil {
			return nil, err
		}
		res.Job = w.Job
	}
	res.Backgrounded = !res.Job.Status.Ended()
	t, err := s.tail(res.Job.ID)
	if err != nil {
		return nil, err
	}
	res.Output, res.OutputBytes, res.OutputTruncated, res.OutputLines, res.TotalLines = t.data, t.size, t.truncated, t.lines, t.total
	return res, nil
}

// snapshot returns a copy of the job that the caller may keep: the live job keeps changing.
func (s *Service) snapshot(id string, fallback *Job) *Job {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.live[id]; ok {
		j := *l.job
		j.OutputBytes = l.size
		j.QueuedReason = s.fleet.queuedReason(&j)
		return &j
	}
	j := *fallback
	return &j
}

// Job returns a job by id.
func (s *Service) Job(ctx context.Context, id string) (*Job, error) {
	j, _, _, err := s.current(ctx, id)
	return j, err
}

// Jobs lists jobs, newest first.
func (s *Service) Jobs(ctx context.Context, f JobFilter) ([]*Job, error) {
	if f.Status != "" && !f.Status.Valid() {
		return nil, Errorf(EINVALID, "status %q is not one of queued, running, succeeded, failed, aborted.", f.Status)
	}
	if f.Limit < 0 || f.Limit > 1000 {
		return nil, Errorf(EINVALID, "limit must be between 1 and 1000.")
	}
	if f.Limit == 0 {
		f.Limit = 100
	}
	jobs, err := s.jobs.Jobs(ctx, f)
	if err != nil {
		return nil, err
	}
	for i, j := range jobs {
		jobs[i] = s.snapshot(j.ID, j)
	}
	return jobs, nil
}

// current returns the job's current state, its body size and a channel closed at its next change;
// the channel is nil once the job has ended.
func (s *Service) current(ctx context.Context, id string) (*Job, int64, <-chan struct{}, error) {
	s.mu.Lock()
	if l, ok := s.live[id]; ok {
		j := *l.job
		j.OutputBytes = l.size
		j.QueuedReason = s.fleet.queuedReason(&j)
		size, ch := l.size, l.changed
		s.mu.Unlock()
		return &j, size, ch, nil
	}
	s.mu.Unlock()
	if !proto.ValidToken(id) {
		return nil, 0, nil, Errorf(ENOTFOUND, "Job %q does not exist.", id)
	}
	j, err := s.jobs.Job(ctx, id)
	if err != nil {
		return nil, 0, nil, err
	}
	return j, j.OutputBytes, nil, nil
}

// WaitResult is what a wait saw.
type WaitResult struct {
	Job            *Job
	Done           bool
	PatternMatched bool
	// Matched is the text the pattern matched (at most MaxMatchBytes), at MatchedOffset in the output.
	Matched       string
	MatchedOffset int64
	// Port is the port the wait asked for (WaitCond.Port, AnyPort), once the job listens on it.
	Port *Port
}

// WaitCond is what a wait returns on besides the job's end and its timeout.
type WaitCond struct {
	// Pattern matches the output so far (a tty job's without escape sequences).
	Pattern *regexp.Regexp
	// Port: once the job listens on this TCP port; AnyPort: on any.
	Port    int
	AnyPort bool
}

// port returns the port of j that c waits for.
func (c WaitCond) port(j *Job) (Port, bool) {
	for _, p := range j.Ports {
		if c.AnyPort || c.Port != 0 && p.Port == c.Port {
			return p, true
		}
	}
	return Port{}, false
}

// Wait returns when the job ends, when pattern (if any) matches its output so far, or after timeout.
// While it waits it observes the job: an end it reports is not notified.
//
// A timeout above MaxWaitTimeout is clamped to it, as the agent tools do.
func (s *Service) Wait(ctx context.Context, id string, timeout time.Duration, pattern *regexp.Regexp) (*WaitResult, error) {
	return s.WaitFor(ctx, id, timeout, WaitCond{Pattern: pattern})
}

// WaitFor is Wait that also returns when the job listens on a port (cond.Port, cond.AnyPort).
func (s *Service) WaitFor(ctx context.Context, id string, timeout time.Duration, cond WaitCond) (*WaitResult, error) {
	if cond.Port < 0 || cond.Port > 65535 {
		return nil, Errorf(EINVALID, "port must be between 1 and 65535, or any.")
	}
	if timeout < 0 {
		return nil, Errorf(EINVALID, "timeout_ms must not be negative.")
	}
	timeout = min(timeout, MaxWaitTimeout)
	s.mu.Lock()
	l := s.live[id]
	if l != nil {
		l.observers++
	}
	s.mu.Unlock()
	return s.wait(ctx, id, l, timeout, cond)
}

// wait is Wait for a caller already counted among l's observers (l nil: the job is not live). It
// uncounts the caller when it returns.
func (s *Service) wait(ctx context.Context, id string, l *liveJob, timeout time.Duration, cond WaitCond) (res *WaitResult, err error) {
	if l != nil {
		defer func() { s.unobserve(l, err == nil && res.Done) }()
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var scan *scanner
	for {
		job, size, changed, err := s.current(ctx, id)
		if err != nil {
			return nil, err
		}
		if scan == nil && cond.Pattern != nil {
			scan = s.scanner(id, cond.Pattern, job.TTY)
		}
		if scan != nil {
			m, err := scan.advance(s.out, id, size, func(n int64) { s.scannedBytes.Add(n) })
			if err != nil {
				return nil, err
			}
			if m != nil {
				return &WaitResult{Job: job, Done: job.Status.Ended(), PatternMatched: true, Matched: string(m.text), MatchedOffset: m.offset}, nil
			}
		}
		if p, ok := cond.port(job); ok {
			return &WaitResult{Job: job, Done: job.Status.Ended(), Port: &p}, nil
		}
		if changed == nil {
			return &WaitResult{Job: job, Done: true}, nil
		}
		select {
		case <-changed:
		case <-timer.C:
			// The end may have come with the timeout: report it rather than leave it unseen.
			if job, _, changed, err = s.current(ctx, id); err != nil {
				return nil, err
			}
			return &WaitResult{Job: job, Done: changed == nil}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// unobserve uncounts an observer of l. When the job's end was observed but the last observer leaves
// without having reported it (it gave up, its caller went away), the finished notification is
// stored after all, so that the end is never lost.
func (s *Service) unobserve(l *liveJob, sawEnd bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l.observers--
	if sawEnd {
		l.endSeen = true
	}
	if l.observers > 0 || !l.job.Observed || l.endSeen || l.ownerKill || l.quiet || l.endNotified() {
		return
	}
	l.endSeen = true // once
	n := finishedNote(l.job)
	if err := s.sessions.deliver(context.Background(), l.job, []note{n}); err != nil {
		s.cfg.Logger.Error("store finished notification", "job", l.job.ID, "err", err)
	}
}

// Output returns a reader of the job's body from offset, at most limit bytes (limit < 0: all there is
// now), and the body's size now.
func (s *Service) Output(ctx context.Context, id string, offset, limit int64) (io.ReadCloser, int64, error) {
	if offset < 0 {
		return nil, 0, Errorf(EINVALID, "offset must not be negative.")
	}
	_, size, _, err := s.current(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	if offset > size {
		offset = size
	}
	n := size - offset
	if limit >= 0 && limit < n {
		n = limit
	}
	rc, err := s.out.Open(id, offset, n)
	return rc, size, err
}

// Follow writes the job's body from offset to w as it grows, until the job ends and everything is
// written, or ctx ends. flush is called after each write.
func (s *Service) Follow(ctx context.Context, id string, offset int64, w io.Writer, flush func()) error {
	if offset < 0 {
		return Errorf(EINVALID, "offset must not be negative.")
	}
	for {
		_, size, changed, err := s.current(ctx, id)
		if err != nil {
			return err
		}
		if size > offset {
			rc, err := s.out.Open(id, offset, size-offset)
			if err != nil {
				return err
			}
			n, err := io.Copy(w, rc)
			rc.Close()
			offset += n
			if err != nil {
				return err
			}
			flush()
		}
		if changed == nil {
			if offset >= size {
				return nil
			}
			continue
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil
		}
	}
}

// KillFrom is Kill asked for by a caller of session. A stop (TERM or KILL) asked for by the job's
// own session is the agent's own doing: its end counts as observed and notifies nothing, as the
// agent tools mark a job notified before they kill it. A kill from another session (or "", none)
// notifies, as a timeout does. Should the kill fail, the end notifies again.
func (s *Service) KillFrom(ctx context.Context, session, id, signal string) error {
	own := false
	if signal == "" || signal == "TERM" || signal == "KILL" {
		s.mu.Lock()
		if l, ok := s.live[id]; ok && session != "" && l.job.Session == session {
			own, l.ownerKill = !l.ownerKill, true
		}
		s.mu.Unlock()
	}
	err := s.Kill(ctx, id, signal)
	if err != nil && own {
		s.mu.Lock()
		if l, ok := s.live[id]; ok {
			l.ownerKill = false
		}
		s.mu.Unlock()
	}
	return err
}

// Kill stops a job: a queued one is withdrawn, a running one is signalled by its runner. Killing an
// ended job is a conflict.
func (s *Service) Kill(ctx context.Context, id, signal string) error {
	op := proto.OpKill
	switch signal {
	case "", "TERM", "KILL":
	default:
		if _, ok := proto.Signal(signal); !ok {
			return Errorf(EINVALID, "signal %q is not one of HUP INT QUIT KILL USR1 USR2 TERM CONT STOP.", signal)
		}
		op = proto.OpSignal
	}
	s.mu.Lock()
	l, ok := s.live[id]
	if !ok {
		s.mu.Unlock()
		if _, _, _, err := s.current(ctx, id); err != nil {
			return err
		}
		return Errorf(ECONFLICT, "Job %s has already ended.", id)
	}
	runner, seq := l.job.Runner, l.job.WorkSeq
	s.mu.Unlock()

	if runner == "" && op == proto.OpKill {
		withdrawn, err := s.disp.Withdraw(ctx, seq)
		if err != nil {
			return err
		}
		if withdrawn {
			s.mu.Lock()
			defer s.mu.Unlock()
			if l, ok := s.live[id]; ok && l.job.Runner == "" {
				reason := proto.ReasonKilled
				if l.sessionEnded {
					reason = proto.ReasonSessionEnded
				}
				l.job.end(s.cfg.Now(), reason, nil)
				if err := s.finishLocked(ctx, l); err != nil {
					return err
				}
			}
			return nil
		}
		// A runner took it in the meantime; its accepted event names it shortly.
		for runner == "" {
			select {
			case <-time.After(20 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			j, _, changed, err := s.current(ctx, id)
			if err != nil {
				return err
			}
			if changed == nil {
				return Errorf(ECONFLICT, "Job %s has already ended.", id)
			}
			runner = j.Runner
		}
	}
	if runner == "" {
		return Errorf(ECONFLICT, "Job %s is queued; only kill can stop it before it starts.", id)
	}
	reply, err := s.disp.Control(ctx, runner, &Control{Op: op, JobID: id, Signal: signal})
	if err != nil {
		return Errorf(EUNAVAILABLE, "Runner %s did not answer: %v.", runner, err)
	}
	if reply.Code != proto.ReplyOK && reply.Code != proto.ReplyUnknownJob {
		return Errorf(EINTERNAL, "Runner %s refused: %s.", runner, reply.Message)
	}
	return nil
}

// ErrForged is returned for a runner message that is not what it claims to be: an event or chunk
// whose claim is not its job's, or that comes from a runner other than the one running the job. It
// is counted (Stats.Forged) and must be dropped, never retried.
var ErrForged = errors.New("coordinator: forged runner message")

// Forged counts a runner message of a kind (ForgedState, ForgedOutput, ForgedHeartbeat) dropped as
// forged by the adapter that received it, and returns ErrForged wrapped with why.
func (s *Service) Forged(kind, why string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.forgedLocked(kind, why)
}

func (s *Service) forgedLocked(kind, why string) error {
	s.stats.Forged[kind]++
	return fmt.Errorf("%w: %s", ErrForged, why)
}

// checkOwnerLocked fails with ErrForged unless a message from runner with claim may be about job
// j: the claim must be the job's (a job of an earlier version has none to check), and once the job
// started, the runner must be the one that started it. Before the start a runner with the right
// claim may differ from the one that announced the job: work whose ack was lost goes to another
// runner. s.mu is held.
func (s *Service) checkOwnerLocked(j *Job, kind, runner, claim string) error {
	if j.Claim != "" && claim != j.Claim {
		return s.forgedLocked(kind, fmt.Sprintf("job %s: runner %s sent a wrong claim", j.ID, runner))
	}
	if j.StartedAt != nil && runner != j.Runner {
		return s.forgedLocked(kind, fmt.Sprintf("job %s runs on runner %s, not on %s", j.ID, j.Runner, runner))
	}
	return nil
}

// HandleEvent applies a runner's state event. It returns only after the change is stored. e.Runner
// must be the runner the adapter knows sent it (the event subject's); an event whose claim or
// runner is not its job's is ErrForged.
func (s *Service) HandleEvent(ctx context.Context, e *Event) error {
	received := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.live[e.JobID]
	if ok {
		if err := s.checkOwnerLocked(l.job, ForgedState, e.Runner, e.Claim); err != nil {
			return err
		}
	}
	s.stats.Events++
	if !ok {
		// An ended or unknown job. A start after the end (killed while being taken, or lost and
		// then found) must not leave a process running.
		if e.Kind == proto.EventAccepted || e.Kind == proto.EventStarted {
			s.fleet.stopStray(e.Runner, e.JobID)
		}
		return nil
	}
	j := l.job
	at := e.Time
	l.clock.event(e.Stages, received)
	l.retimeLocked()
	switch e.Kind {
	case proto.EventAccepted:
		if j.Status != StatusQueued {
			return nil
		}
		j.Runner = e.Runner
		j.AcceptedAt = &at
	case proto.EventStarted:
		if j.Status != StatusQueued {
			return nil
		}
		j.Runner, j.Pid, j.Status, j.StartedAt = e.Runner, e.Pid, StatusRunning, &at
		if j.AcceptedAt == nil {
			j.AcceptedAt = &at
		}
		if err := s.out.Begin(j); err != nil {
			return err
		}
		l.lastGrowth = s.cfg.Now()
	case proto.EventActivity:
		return s.activityLocked(ctx, l, e)
	case proto.EventExited:
		// Every chunk was stored before the exit event, but one can come back later (a retried
		// publish, a redelivery): the job ends only once its output is whole, or after
		// missingOutputGrace, with what arrived.
		if l.size < e.OutputBytes {
			now := s.cfg.Now()
			if l.exitSeen.IsZero() {
				l.exitSeen = now
			}
			if now.Sub(l.exitSeen) < missingOutputGrace {
				return ErrNotReady
			}
			s.cfg.Logger.Error("job ends with output missing", "job", j.ID, "have", l.size, "want", e.OutputBytes)
		}
		j.Runner = e.Runner
		j.OutputBytes = e.OutputBytes
		j.Signal = e.Signal
		j.Error = e.Error
		j.Usage = e.Usage
		reason := e.Reason
		if l.budgetCut {
			reason = proto.ReasonOutputLimit // the runner says killed: the budget is why
			j.Error = "Stopped: the output of all jobs reached the coordinator's budget (--output-budget)."
		}
		if l.sessionEnded {
			reason = proto.ReasonSessionEnded // the runner says killed: the session is why
		}
		j.end(at, reason, e.ExitCode)
		return s.finishLocked(ctx, l)
	}
	if err := s.jobs.PutJob(ctx, j); err != nil {
		return err
	}
	l.wake()
	return nil
}

// ConfirmStart reports whether the job is queued here and not yet taken: a runner asks before it
// starts work whose NotAfter passed, since the coordinator may have refused that start.
func (s *Service) ConfirmStart(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.live[id]
	return ok && l.job.Status == StatusQueued
}

// finishLocked stores an ended job's notifications, writes its footer and record and wakes its
// waiters. s.mu is held.
//
// The finished notification is decided here, in the same step as the end: if a caller is waiting
// for the end right now, it sees the end and no notification is stored (the job is marked
// observed); otherwise the notification is stored before the job is, and before the event is acked.
// Pending output notifications go first. A job whose session ended notifies nothing.
func (s *Service) finishLocked(ctx context.Context, l *liveJob) error {
	j := l.job
	if j.OutputBytes < l.size {
		j.OutputBytes = l.size
	}
	j.Ports = nil // nothing of the job listens any more
	if !l.quiet {
		var notes []note
		if l.watch != nil {
			l.watch.end(s.cfg.Now())
			notes = l.watch.take()
		}
		if l.observers > 0 || l.ownerKill {
			j.Observed = true
		} else if !l.endNotified() {
			notes = append(notes, finishedNote(j))
		}
		if err := s.sessions.deliver(ctx, l.job, notes); err != nil {
			return err
		}
	}
	if j.StartedAt == nil {
		if err := s.out.Begin(j); err != nil {
			return err
		}
	}
	if err := s.out.End(j); err != nil {
		return err
	}
	l.clock.exitStored = l.clock.since(time.Now())
	l.retimeLocked()
	if err := s.jobs.PutJob(ctx, j); err != nil {
		return err
	}
	delete(s.live, j.ID)
	s.stats.JobsEnded[j.Status]++
	s.budget.ended(l.size, j.OutputBytes)
	l.wake()
	return nil
}

// ErrNotReady is returned for an event that cannot be applied yet (output before the start, an exit
// before all its output); the event is retried shortly.
var ErrNotReady = errors.New("coordinator: event not applicable yet")

// missingOutputGrace is how long an exit event waits for output chunks that have not arrived.
const missingOutputGrace = 30 * time.Second

// HandleChunk writes a piece of output into the job's terminal file. It returns only after the bytes
// are written. A chunk whose claim or runner (c.Runner, the subject's) is not its job's is ErrForged.
func (s *Service) HandleChunk(ctx context.Context, c *Chunk) error {
	s.mu.Lock()
	l, ok := s.live[c.JobID]
	if ok && l.job.StartedAt == nil {
		s.mu.Unlock()
		return ErrNotReady
	}
	if ok {
		if err := s.checkOwnerLocked(l.job, ForgedOutput, c.Runner, c.Claim); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	s.mu.Unlock()
	if !ok {
		// A redelivered chunk of an ended job is still written when it lies inside the output, and
		// comes from the runner that ran the job.
		j, err := s.jobs.Job(ctx, c.JobID)
		if err != nil || c.Offset+int64(len(c.Data)) > j.OutputBytes {
			return nil
		}
		if j.Claim != "" && (c.Claim != j.Claim || c.Runner != j.Runner) {
			return s.Forged(ForgedOutput, fmt.Sprintf("job %s ended: runner %s sent output that is not its own", j.ID, c.Runner))
		}
		return s.out.Write(c.JobID, c.Offset, c.Data)
	}
	if err := s.out.Write(c.JobID, c.Offset, c.Data); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.OutputBytes += int64(len(c.Data))
	old, end := l.size, c.Offset+int64(len(c.Data))
	if c.Stderr && l.watch != nil && end > l.size {
		l.errSpans = append(l.errSpans, span{c.Offset, end})
	}
	if l.wrote(c.Offset, end) {
		if old == 0 {
			l.clock.firstOutput = l.clock.since(time.Now())
			l.retimeLocked()
		}
		if s.budget.grew(l.size-old) && !l.budgetCut && l.job.Runner != "" {
			// The job that writes past the budget is stopped; quiet jobs go on.
			l.budgetCut = true
			s.cfg.Logger.Warn("output budget reached: stopping the job writing", "job", l.job.ID, "budget", s.cfg.OutputBudget)
			s.fleet.stopStray(l.job.Runner, l.job.ID)
		}
		l.lastGrowth, l.stallChecked = s.cfg.Now(), false
		if err := s.watchOutputLocked(ctx, l, old, c); err != nil {
			return err
		}
		l.wake()
	}
	return nil
}

// watchOutputLocked hands the body's newly contiguous bytes [old, l.size) to the job's watch and
// stores what it notifies. The chunk's own bytes are used when they are exactly the new part;
// otherwise (the chunk closed a gap) the new part is read back from the file. s.mu is held.
func (s *Service) watchOutputLocked(ctx context.Context, l *liveJob, old int64, c *Chunk) error {
	if l.watch == nil || l.quiet {
		return nil
	}
	data := c.Data
	if c.Offset != old || c.Offset+int64(len(c.Data)) != l.size {
		rc, err := s.out.Open(l.job.ID, old, l.size-old)
		if err != nil {
			return err
		}
		data, err = io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
	}
	l.feedWatch(data, old, s.cfg.Now())
	if err := s.sessions.deliver(ctx, l.job, l.watch.take()); err != nil {
		return err
	}
	if l.watch.monStopped && !l.watch.monKillAsked && l.job.Runner != "" {
		l.watch.monKillAsked = true
		s.fleet.stopStray(l.job.Runner, l.job.ID)
	}
	return nil
}

// Run does the coordinator's periodic work until ctx ends: it rewrites running jobs' headers and
// marks the jobs of silent runners lost.
func (s *Service) Run(ctx context.Context) {
	defer s.fleet.wait()
	header := time.NewTicker(s.cfg.HeaderInterval)
	defer header.Stop()
	check := time.NewTicker(s.cfg.CheckInterval)
	defer check.Stop()
	notify := time.NewTicker(s.cfg.NotifyInterval)
	defer notify.Stop()
	retain := time.NewTicker(s.cfg.RetentionInterval)
	defer retain.Stop()
	s.budget.retain(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-header.C:
			s.touchHeaders()
		case <-check.C:
			s.markLost(ctx)
		case <-retain.C:
			s.budget.retain(ctx)
		case <-notify.C:
			s.checkNotes(ctx)
			s.endExpired(ctx)
		}
	}
}

func (s *Service) touchHeaders() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	for _, l := range s.live {
		if l.job.Status == StatusRunning {
			if err := s.out.Touch(l.job, now.Sub(*l.job.StartedAt)); err != nil {
				s.cfg.Logger.Warn("rewrite header", "job", l.job.ID, "err", err)
			}
		}
	}
}

// markLost ends, as lost, the jobs of runners that went silent or restarted and the jobs taken but
// never started. Silence counts only while the coordinator's own link was up (checkLink).
func (s *Service) markLost(ctx context.Context) {
	linkUp, ok := s.fleet.checkLink(ctx)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	// The runners are looked at once, under the jobs' lock: a heartbeat that comes meanwhile is
	// applied as if after this pass.
	runners := s.fleet.sweep(now, linkUp)
	for _, l := range s.live {
		j := l.job
		if j.Runner == "" {
			continue
		}
		r, known := runners[j.Runner]
		var why string
		switch {
		case !known && now.Sub(later(s.start, linkUp)) > s.cfg.RunnerDeadline:
			why = "its runner " + j.Runner + " stopped sending heartbeats"
		case known && j.AcceptedAt != nil && j.AcceptedAt.Before(r.Boot):
			why = "its runner " + j.Runner + " restarted"
		case j.StartedAt == nil && j.AcceptedAt != nil && now.Sub(later(*j.AcceptedAt, linkUp)) > s.cfg.StartDeadline:
			why = "it was taken by runner " + j.Runner + " but never started"
		default:
			continue
		}
		j.Error = "Lost: " + why + "."
		j.end(now, proto.ReasonLost, nil)
		if err := s.finishLocked(ctx, l); err != nil {
			s.cfg.Logger.Error("mark job lost", "job", j.ID, "err", err)
		}
	}
}
