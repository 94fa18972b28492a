package coordinator

import (
	"context"
	"errors"
	"io"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sbx-dev/sbx/proto"
)

// Service is the coordinator: it starts jobs, applies the runners' events to them and answers
// questions about them. Events are applied by one goroutine (the event consumer); API calls come
// concurrently.
//
// Service is the thin front the adapters call: it checks a call's arguments and routes it to the
// part that owns what it touches, each a type of its own with its own mutex and invariants:
//
//   - lifecycle (lifecycle.go; activity.go, stall.go, deliver.go, fence.go): the jobs not ended,
//     their events, output, waiters and end;
//   - fleet (runners.go): runner membership, the coordinator's link, stray kill requests;
//   - sessionBook (sessionbook.go): sessions, their notifications' seqs, cursors and leases;
//   - retention (retention.go): the output budget and what is kept of ended jobs.
//
// Lock order: lifecycle → fleet → sessionBook → retention. A part holding its lock calls only into
// parts after it, never before: a job's end (lifecycle.finishLocked) stores its notifications
// (sessionBook.deliver) and moves its output in the budget (retention.ended) under the jobs' lock;
// a chunk past the budget and an event of an ended job ask the fleet for a stray kill under it;
// fence and markLost look at the runners under it; a session's end (lifecycle.endSession) ends
// the session and marks its jobs under it. fleet, sessionBook and retention call no other part.
// The front holds no lock of its own but scanMu (scan.go), which nests in none.
type Service struct {
	cfg   Config
	store Store
	out   OutputStore
	disp  Dispatcher

	// The parts, each owning its state under its own lock (the lock order above).
	jobs     *lifecycle
	fleet    *fleet
	sessions *sessionBook
	budget   *retention

	// scans are the waits' output scanners by job and pattern (scan.go); scannedBytes counts the
	// output they read, for Stats.
	scanMu       sync.Mutex
	scans        map[scanKey]*scanner
	scannedBytes atomic.Int64
}

// New returns a Service. It loads the unfinished jobs of an earlier life from the store.
func New(ctx context.Context, cfg Config, store Store, out OutputStore, disp Dispatcher) (*Service, error) {
	cfg.setDefaults()
	s := &Service{cfg: cfg, store: store, out: out, disp: disp, scans: map[scanKey]*scanner{}}
	s.fleet = newFleet(&s.cfg, disp, cfg.Now())
	var err error
	if s.sessions, err = newSessionBook(ctx, &s.cfg, store); err != nil {
		return nil, err
	}
	if s.budget, err = newRetention(ctx, &s.cfg, store, out); err != nil {
		return nil, err
	}
	if s.jobs, err = newLifecycle(ctx, &s.cfg, store, out, s.fleet, s.sessions, s.budget); err != nil {
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

	// With BlockUntil the caller observes from now on: a job that ends before the wait below
	// begins is seen too.
	l, err := s.jobs.add(ctx, job, accepted, req.BlockUntil > 0)
	if err != nil {
		return nil, err
	}
	seq, err := s.disp.Dispatch(ctx, work)
	if err != nil {
		s.jobs.notQueued(ctx, l, err)
		return nil, Errorf(EUNAVAILABLE, "The job could not be queued; is NATS reachable?")
	}
	s.jobs.dispatched(l, seq)
	if queued != nil {
		queued(job.ID)
	}

	res := &StartResult{Job: s.jobs.snapshot(job.ID, job), Accepted: accepted}
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
	jobs, err := s.store.Jobs(ctx, f)
	if err != nil {
		return nil, err
	}
	for i, j := range jobs {
		jobs[i] = s.jobs.snapshot(j.ID, j)
	}
	return jobs, nil
}

// current returns the job's current state, its body size and a channel closed at its next change;
// the channel is nil once the job has ended.
func (s *Service) current(ctx context.Context, id string) (*Job, int64, <-chan struct{}, error) {
	return s.jobs.current(ctx, id)
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
	return s.wait(ctx, id, s.jobs.observe(id), timeout, cond)
}

// wait is Wait for a caller already counted among l's observers (l nil: the job is not live). It
// uncounts the caller when it returns.
func (s *Service) wait(ctx context.Context, id string, l *liveJob, timeout time.Duration, cond WaitCond) (res *WaitResult, err error) {
	if l != nil {
		defer func() { s.jobs.unobserve(l, err == nil && res.Done) }()
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
		own = s.jobs.ownKill(session, id)
	}
	err := s.Kill(ctx, id, signal)
	if err != nil && own {
		s.jobs.unownKill(id)
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
	runner, seq, ok := s.jobs.placed(id)
	if !ok {
		if _, _, _, err := s.current(ctx, id); err != nil {
			return err
		}
		return Errorf(ECONFLICT, "Job %s has already ended.", id)
	}

	if runner == "" && op == proto.OpKill {
		withdrawn, err := s.disp.Withdraw(ctx, seq)
		if err != nil {
			return err
		}
		if withdrawn {
			return s.jobs.withdrawn(ctx, id)
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
	return s.jobs.forged(kind, why)
}

// HandleEvent applies a runner's state event. It returns only after the change is stored. e.Runner
// must be the runner the adapter knows sent it (the event subject's); an event whose claim or
// runner is not its job's is ErrForged.
func (s *Service) HandleEvent(ctx context.Context, e *Event) error {
	return s.jobs.event(ctx, e)
}

// ConfirmStart reports whether the job is queued here and not yet taken: a runner asks before it
// starts work whose NotAfter passed, since the coordinator may have refused that start.
func (s *Service) ConfirmStart(id string) bool {
	return s.jobs.queued(id)
}

// HandleChunk writes a piece of output into the job's terminal file. It returns only after the bytes
// are written. A chunk whose claim or runner (c.Runner, the subject's) is not its job's is ErrForged.
func (s *Service) HandleChunk(ctx context.Context, c *Chunk) error {
	return s.jobs.chunk(ctx, c)
}

// ErrNotReady is returned for an event that cannot be applied yet (output before the start, an exit
// before all its output); the event is retried shortly.
var ErrNotReady = errors.New("coordinator: event not applicable yet")

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
			s.jobs.touchHeaders()
		case <-check.C:
			s.jobs.markLost(ctx)
		case <-retain.C:
			s.budget.retain(ctx)
		case <-notify.C:
			s.jobs.checkNotes(ctx)
			s.endExpired(ctx)
		}
	}
}
