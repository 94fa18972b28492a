// Package runner is the runner service: it takes work from JetStream while it has a free slot, runs
// each job in its own cgroup through sandbox, streams the job's output and state into the event
// stream, answers control requests and sends heartbeats.
package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/sbx-dev/sbx/internal/jsready"
	"github.com/sbx-dev/sbx/proto"
	"github.com/sbx-dev/sbx/sandbox"
)

// Config configures a Runner; zero fields take their defaults.
type Config struct {
	// ID names the runner (default: the host name). It must be a subject token.
	ID string
	// Pool is the pool whose work it takes ("default").
	Pool string
	// Slots is how many jobs it runs at once (default 256). It is a guard against runaway load, not a
	// measure of the machine: agents keep dev servers and watchers running for hours, and a small
	// count would queue an `echo` behind them.
	Slots int
	// Cgroup configures the runner's cgroups. Its Root (default "sbx") gets the runner id appended, so
	// that runners sharing a machine never sweep each other's jobs. Its Bwrap names the bubblewrap
	// binary of readonly jobs (default "bwrap" on PATH).
	Cgroup sandbox.Config
	// User is the account jobs run as by default; Users are the others a job may ask for. With a
	// User set, no job runs as anyone else. Without one, a runner that is not root runs jobs as itself,
	// and a root runner runs each as the owner of its cwd, or as JobUser when root owns it (see account).
	User  string
	Users []string
	// AllowRoot lets jobs run as root: a root runner without a User then runs them as itself, and
	// User or a job may name root. Without it, no job runs as uid 0.
	AllowRoot bool
	// jobUser is JobUser; a test names one that does not exist.
	jobUser string
	// Shell is the absolute path of the shell a job runs in when it names none (default: bash when it
	// is installed, else /bin/sh): agents write bash.
	Shell string
	// Labels describe the runner in GET /v1/runners.
	Labels map[string]string
	// Version is reported in heartbeats.
	Version string
	// Environ is the environment plain jobs inherit (default os.Environ()); variables named SBX_* or
	// NATS_*, and any whose value names a Secrets path, never reach a job. Readonly jobs get only its
	// PATH, HOME, LANG and TERM (see readonlyEnv).
	Environ []string
	// Secrets are the absolute paths of what the runner holds and jobs must not: its NATS
	// credentials, a token file, a TLS key, a data dir. A plain job's environment loses the variables
	// that name one; readonly jobs do not see them at all (they are added to Cgroup.Hide). What keeps
	// a plain job out is the files' modes and the job's user, which is never root unless AllowRoot.
	Secrets []string
	// Deadline is the coordinator's runner deadline (proto.DefaultRunnerDeadline, 8 s): how long the
	// runner may go unheard before its jobs are marked lost. The heartbeat interval and the fence
	// derive from it.
	Deadline time.Duration
	// HeartbeatInterval is the time between heartbeats (proto.HeartbeatInterval of Deadline: 2 s).
	HeartbeatInterval time.Duration
	// Heartbeats, when set, is a connection of the runner's own for its heartbeats, to the same
	// NATS as nc with the same creds. On nc they queue behind the jobs' output: nats.go writes a
	// publish under the connection's lock, so while a job's output cannot be written (a slow link,
	// a starved server) a heartbeat waits for it — 14 s once, in a process held to 4 % of a CPU
	// writing a 100 MB line — and the runner fences jobs that are doing fine. Nil: nc.
	Heartbeats *nats.Conn
	// DrainTimeout, when positive, makes the end of Run's context a drain: the runner takes no more
	// work, says draining in its heartbeats, and lets its jobs run up to DrainTimeout before it
	// kills those left (reason killed). Zero: it kills its jobs at once.
	DrainTimeout time.Duration
	// Coalesce is how long output is gathered into one chunk after its first byte (2 ms).
	Coalesce time.Duration
	// PublishWindow is the number of output chunks in flight before the runner waits for acks (64).
	PublishWindow int
	// ScanInterval is how often a running job's processes are looked at in /proc, for whether they
	// wait for input and the ports they listen on (1 s); negative: never.
	ScanInterval time.Duration
	Logger       *slog.Logger
}

// DefaultID is a runner's id when none is given: the host name, with every character that cannot be
// in a subject token replaced by '-'.
func DefaultID() (string, error) {
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("runner id: %w", err)
	}
	return strings.Map(func(r rune) rune {
		if proto.ValidToken(string(r)) {
			return r
		}
		return '-'
	}, host), nil
}

func (c *Config) setDefaults() error {
	if c.ID == "" {
		id, err := DefaultID()
		if err != nil {
			return err
		}
		c.ID = id
	}
	if !proto.ValidToken(c.ID) {
		return fmt.Errorf("runner id %q must be 1-64 characters of letters, digits, '_' and '-'", c.ID)
	}
	if c.Pool == "" {
		c.Pool = "default"
	}
	if !proto.ValidToken(c.Pool) {
		return fmt.Errorf("pool %q must be 1-64 characters of letters, digits, '_' and '-'", c.Pool)
	}
	if c.Slots == 0 {
		c.Slots = DefaultSlots
	}
	if c.Slots < 1 || c.Slots > MaxSlots {
		return fmt.Errorf("slots %d must be between 1 and %d", c.Slots, MaxSlots)
	}
	for _, u := range append([]string{c.User}, c.Users...) {
		if u == "" {
			continue
		}
		a, err := lookupAccount(u)
		if err != nil {
			return err
		}
		if a.cred.UID == 0 && !c.AllowRoot {
			return fmt.Errorf("user %s is root: jobs run as root only when that is allowed (--allow-root-jobs)", u)
		}
	}
	if c.jobUser == "" {
		c.jobUser = JobUser
	}
	if len(c.Users) > 0 && c.User == "" {
		return errors.New("users: allowing other users needs a default user")
	}
	if c.Shell == "" {
		c.Shell = "/bin/sh"
		if bash, err := exec.LookPath("bash"); err == nil {
			c.Shell = bash
		}
	}
	if !filepath.IsAbs(c.Shell) {
		return fmt.Errorf("shell %q must be an absolute path", c.Shell)
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.Environ == nil {
		c.Environ = os.Environ()
	}
	if c.Deadline == 0 {
		c.Deadline = proto.DefaultRunnerDeadline
	}
	if c.Deadline < proto.MinRunnerDeadline {
		return fmt.Errorf("deadline %s must be at least %s", c.Deadline, proto.MinRunnerDeadline)
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = proto.HeartbeatInterval(c.Deadline)
	}
	if c.Coalesce == 0 {
		c.Coalesce = 2 * time.Millisecond
	}
	if c.ScanInterval == 0 {
		c.ScanInterval = time.Second
	}
	if c.PublishWindow == 0 {
		c.PublishWindow = 64
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// maxPending bounds the jobs a runner has taken and not started yet (Runner.pending): twice what a
// sandbox.Manager starts at once.
const maxPending = 32

// DefaultSlots is a runner's default number of slots.
const DefaultSlots = 256

// MaxSlots bounds Config.Slots, as many as a heartbeat can list (proto.MaxHeartbeatJobs). A
// running job holds two file descriptors (its output and the init step's status pipe), two
// processes (the init step and the job) and a few goroutines (docs/limits.md, "A runner's slots").
const MaxSlots = proto.MaxHeartbeatJobs

// Runner runs jobs from one pool.
type Runner struct {
	cfg Config
	nc  *nats.Conn
	// beats carries the heartbeats: Config.Heartbeats, else nc.
	beats *nats.Conn
	js    jetstream.JetStream
	// work binds to and pulls from the work consumers through the coordinator (proto.PullPrefix),
	// which delivers only into the runner's inbox.
	work jetstream.JetStream
	mgr  *sandbox.Manager
	boot time.Time

	// readonly is the verdict of the start-up probe, set once in Run before any job or heartbeat can
	// read it and never changed after: a failed probe is not retried into a weaker state.
	readonly readonlyVerdict

	slots chan struct{} // one token per running (or being started) job, or per take loop pulling
	// pending holds one token per job taken and not started yet, or per take loop pulling: a runner
	// with thousands of free slots took thousands of jobs at once and started them at the pace its
	// machine could, and those it had not started within the coordinator's start deadline (60 s)
	// were lost (BenchmarkSleepingJobs with 3,000 jobs). Work it does not take yet stays queued.
	pending chan struct{}
	wg      sync.WaitGroup
	// draining is set once Run's context ended with a DrainTimeout: heartbeats say so.
	draining atomic.Bool
	// fenceAfter is how long the jobs may go on without a heartbeat that NATS confirmed
	// (proto.RunnerFenceAfter of Deadline: 6 s); guard is the fence process that enforces it even
	// while the runner cannot (sandbox.StartFence), renewed by the heartbeats and replaced by them
	// once it fired. It is nil outside Run, and while a fence that fired could not be replaced.
	fenceAfter time.Duration
	guard      atomic.Pointer[sandbox.Fence]
	// listen tells the activity watchers whether the runner's listening sockets changed.
	listen listenGate

	mu   sync.Mutex
	jobs map[string]*job
}

// New returns a Runner with its cgroup root created. It takes no work until Run. nc's inbox prefix
// must be proto.RunnerInbox of the runner's id (nats.CustomInboxPrefix): the coordinator delivers
// work and answers confirmations into that inbox only.
func New(nc *nats.Conn, cfg Config) (*Runner, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if cfg.Cgroup.Root == "" {
		cfg.Cgroup.Root = "sbx"
	}
	cfg.Cgroup.Root += "/" + cfg.ID
	cfg.Cgroup.Hide = append(slices.Clone(cfg.Cgroup.Hide), cfg.Secrets...)
	mgr, err := sandbox.NewManager(cfg.Cgroup)
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4*cfg.PublishWindow))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	work, err := jetstream.NewWithAPIPrefix(nc, proto.PullPrefix(cfg.ID))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	beats := cfg.Heartbeats
	if beats == nil {
		beats = nc
	}
	return &Runner{
		cfg: cfg, nc: nc, beats: beats, js: js, work: work, mgr: mgr, boot: time.Now(), fenceAfter: proto.RunnerFenceAfter(cfg.Deadline),
		slots: make(chan struct{}, cfg.Slots), pending: make(chan struct{}, maxPending), jobs: map[string]*job{},
	}, nil
}

// ID is the runner's id.
func (r *Runner) ID() string { return r.cfg.ID }

// Run sweeps the cgroups of an earlier life, starts the fence, registers the control service,
// heartbeats and runs work until ctx ends; then it drains (see DrainTimeout), kills its jobs, reports
// their ends and returns. Heartbeats, control requests and the jobs' events go on until the jobs are
// over.
func (r *Runner) Run(ctx context.Context) error {
	defer func() {
		r.mgr.Close() // its warm init steps; the jobs are over when Run returns
		// Then the fence, which kills what is left under the cgroup root as it ends: nothing.
		if f := r.guard.Swap(nil); f != nil {
			if err := f.Close(); err != nil {
				r.cfg.Logger.Error("fence", "err", err)
			}
		}
	}()
	swept, err := r.mgr.Sweep()
	if err != nil {
		return fmt.Errorf("sweep cgroups: %w", err)
	}
	f, err := r.mgr.StartFence(r.fenceAfter)
	if err != nil {
		return err
	}
	r.guard.Store(f)
	if swept > 0 {
		r.cfg.Logger.Warn("killed jobs of an earlier life", "cgroups", swept)
	}
	r.logUsers()
	svc, err := micro.AddService(r.nc, micro.Config{
		Name:        proto.ServiceName,
		Version:     "1.0.0",
		Description: "sbx runner " + r.cfg.ID,
		Metadata:    map[string]string{"runner": r.cfg.ID, "pool": r.cfg.Pool},
		Endpoint: &micro.EndpointConfig{
			Subject: proto.ControlSubject(r.cfg.ID),
			Handler: micro.HandlerFunc(r.handleControl),
		},
	})
	if err != nil {
		return fmt.Errorf("register service: %w", err)
	}
	defer svc.Stop()

	r.readonly = r.probeReadonly(ctx)
	caps := []string{proto.CapPlain}
	if r.readonly.ok {
		caps = append(caps, proto.CapReadonly)
	}
	// Heartbeats go first: the coordinator creates the work consumers of a pool when it hears of a
	// runner of that pool, and the runner binds to them. They go on through the drain, as the jobs'
	// events do: jobCtx outlives ctx by the drain.
	jobCtx, endJobs := context.WithCancel(context.WithoutCancel(ctx))
	defer endJobs()
	var beats, takes sync.WaitGroup
	beats.Add(1)
	go func() { defer beats.Done(); r.heartbeat(jobCtx) }()
	var consumers []jetstream.Consumer
	for _, c := range caps {
		cons, err := r.consumer(ctx, c)
		if err != nil {
			endJobs()
			beats.Wait()
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		consumers = append(consumers, cons)
	}
	takes.Add(len(consumers))
	for _, cons := range consumers {
		go func() { defer takes.Done(); r.take(ctx, jobCtx, cons) }()
	}
	<-ctx.Done()
	takes.Wait()
	if r.cfg.DrainTimeout > 0 {
		r.drain()
	}
	r.stopAll(proto.ReasonKilled, "the runner is shutting down")
	endJobs()
	r.wg.Wait()
	beats.Wait()
	return nil
}

// drain waits for the jobs to end, up to DrainTimeout, while heartbeats say the runner drains; then
// it kills those left.
func (r *Runner) drain() {
	r.draining.Store(true)
	r.mu.Lock()
	n := len(r.jobs)
	r.mu.Unlock()
	r.cfg.Logger.Info("draining: no more work is taken", "jobs", n, "timeout", r.cfg.DrainTimeout)
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
		r.cfg.Logger.Info("drained: every job ended")
	case <-time.After(r.cfg.DrainTimeout):
		r.stopAll(proto.ReasonKilled, fmt.Sprintf("the runner was stopped and the job outlived its drain (%s)", r.cfg.DrainTimeout))
		r.cfg.Logger.Warn("drain timed out: killed the jobs left")
		<-done
	}
}

// stopAll stops every job of the runner for a reason.
//
// The kills happen outside r.mu: each freezes and kills a cgroup, and thousands of them under the
// lock held up the heartbeats that take it, long enough to fire the fence of a runner that was
// only shutting down.
func (r *Runner) stopAll(reason, why string) {
	r.mu.Lock()
	jobs := make([]*job, 0, len(r.jobs))
	for _, j := range r.jobs {
		jobs = append(jobs, j)
	}
	r.mu.Unlock()
	for _, j := range jobs {
		j.stop(reason, why)
	}
}

// consumer binds to the pool's shared work consumer for a capability, waiting for the coordinator to
// create it: a runner may bind to a work consumer and pull from it, but not create, change or delete
// one (see docs/security.md).
func (r *Runner) consumer(ctx context.Context, capability string) (jetstream.Consumer, error) {
	name := proto.WorkConsumer(r.cfg.Pool, capability)
	// The coordinator creates the consumer when it hears the runner's first heartbeat, a moment
	// after the start: the first tries come quickly, so that the first job does not wait a second.
	var said time.Time
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		cons, err := r.work.Consumer(ctx, proto.WorkStream, name)
		if err == nil {
			return cons, nil
		}
		quiet := time.Since(said) < time.Second
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound):
			if !quiet {
				r.cfg.Logger.Info("waiting for the coordinator to create the work consumer", "consumer", name)
				said = time.Now()
			}
		case jsready.NotReady(err) && ctx.Err() == nil:
			if !quiet {
				r.cfg.Logger.Info("waiting for JetStream", "err", err)
				said = time.Now()
			}
		default:
			return nil, fmt.Errorf("bind work consumer %s: %w", name, err)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// pullExpiry bounds one pull for work; a pull that expires empty is made again.
const pullExpiry = 30 * time.Second

// take pulls one message at a time, only while a slot is free, and starts a job for each, until ctx
// ends; the jobs run under jobCtx, which outlives ctx by the drain.
//
// The take loops (one per capability: plain, and readonly when the probe passed) share r.slots. A loop
// does not hold a slot while it pulls: an idle loop (no readonly work queued) would then keep a slot
// that queued plain work needs for a whole pull. Instead a loop waits until a slot is free, pulls, and
// takes a slot only once a message has arrived. When the other loop took the last slot meanwhile, the
// message is Nak'd before it is announced, acked or started, and JetStream hands it to the next pull,
// of this runner or another. So jobs never outnumber slots, a free slot never idles while either
// subject has work, and each pull that raced bounces at most one message.
func (r *Runner) take(ctx, jobCtx context.Context, cons jetstream.Consumer) {
	for {
		// Wait for a free slot without keeping it.
		select {
		case r.slots <- struct{}{}:
			<-r.slots
		case <-ctx.Done():
			return
		}
		// Keep a place among the jobs taken and not started yet, until this one has started.
		select {
		case r.pending <- struct{}{}:
		case <-ctx.Done():
			return
		}
		fetchCtx, cancel := context.WithTimeout(ctx, pullExpiry)
		msg, err := cons.Next(jetstream.FetchContext(fetchCtx))
		cancel()
		if err != nil {
			<-r.pending
			if ctx.Err() != nil {
				return
			}
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
				r.cfg.Logger.Warn("fetch work", "err", err)
				select {
				case <-time.After(time.Second):
				case <-ctx.Done():
					return
				}
			}
			continue
		}
		select {
		case r.slots <- struct{}{}:
		default:
			// Every slot went to the other loop while this one pulled.
			<-r.pending
			if err := msg.Nak(); err != nil {
				r.cfg.Logger.Warn("hand back work", "err", err)
			}
			continue
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer func() { <-r.slots }()
			r.run(jobCtx, msg, func() { <-r.pending })
		}()
	}
}

// heartbeat announces the runner until ctx ends, renews the fence after each heartbeat that reached
// NATS, and fences the runner's jobs itself when it has not reached NATS for fenceAfter. A heartbeat
// counts as reaching NATS once the server answered the flush that follows it. The fence process
// kills the jobs at the same time while the runner lives, and alone while it is stopped (SIGSTOP, a
// hung host) or dead; the runner's own check, before each heartbeat, gives the jobs it finds their
// reason, lost.
func (r *Runner) heartbeat(ctx context.Context) {
	t := time.NewTicker(r.cfg.HeartbeatInterval)
	defer t.Stop()
	reached := time.Now()
	for {
		if time.Since(reached) > r.fenceAfter {
			r.fence(time.Since(reached))
		}
		r.mu.Lock()
		running := len(r.jobs)
		ids := make([]string, 0, running)
		for id := range r.jobs {
			ids = append(ids, id)
		}
		r.mu.Unlock()
		slices.Sort(ids)
		hb := &proto.Heartbeat{
			V: proto.Version, Runner: r.cfg.ID, Pool: r.cfg.Pool, Slots: r.cfg.Slots, Running: min(running, r.cfg.Slots),
			Readonly: r.readonly.ok, ReadonlyReason: r.readonly.reason,
			Cgroup: r.mgr.Describe(), Labels: r.cfg.Labels, Version: r.cfg.Version, Boot: r.boot, Time: time.Now(),
			Draining: r.draining.Load(), Jobs: ids[:min(len(ids), proto.MaxHeartbeatJobs)],
		}
		sent := time.Now()
		err := r.beats.Publish(proto.HeartbeatSubject(r.cfg.ID, r.cfg.Pool), proto.Encode(hb))
		published := time.Since(sent)
		if err == nil {
			err = r.beats.FlushTimeout(r.cfg.HeartbeatInterval)
		}
		took := time.Since(sent)
		if err != nil {
			r.cfg.Logger.Warn("heartbeat", "err", err, "took", took.Round(time.Millisecond))
		} else {
			// A heartbeat late to reach NATS eats into the fence: say where the time went (the
			// publish waits for the connection's lock, the flush for the server's answer).
			if took > r.cfg.HeartbeatInterval/2 {
				r.cfg.Logger.Warn("heartbeat slow to reach NATS", "took", took.Round(time.Millisecond), "publish", published.Round(time.Millisecond))
			}
			reached = time.Now()
			r.renewFence()
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// renewFence renews the fence process, or replaces one that fired or died: a runner that was
// stopped past fenceAfter comes back to jobs the fence killed and starts a new one for the next. It
// waits for a fence that fired to end, that is for its kills to be done.
func (r *Runner) renewFence() {
	f := r.guard.Load()
	if f != nil {
		err := f.Renew()
		if err == nil {
			return
		}
		r.cfg.Logger.Warn("fence gone: starting another", "err", err)
		r.guard.Store(nil)
		if err := f.Close(); err != nil {
			r.cfg.Logger.Error("fence", "err", err)
		}
	}
	f, err := r.mgr.StartFence(r.fenceAfter)
	if err != nil {
		r.cfg.Logger.Error("start fence: the jobs have none until the next heartbeat", "err", err)
		return
	}
	r.guard.Store(f)
}

// fence kills every job of the runner as lost: it has not reached NATS for silent, past fenceAfter,
// so the coordinator gives them up. Their ends are reported once NATS is back.
func (r *Runner) fence(silent time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, j := range r.jobs {
		if j.stop(proto.ReasonLost, r.fencedWhy(silent.Round(time.Second).String())) {
			n++
		}
	}
	if n > 0 {
		r.cfg.Logger.Error("cut off from NATS past the deadline: killed the jobs", "jobs", n, "silent", silent.Round(time.Millisecond))
	}
}

// fencedWhy is the error of a job fenced after the runner did not reach NATS for silent.
func (r *Runner) fencedWhy(silent string) string {
	return fmt.Sprintf("runner %s could not reach NATS for %s (fence %s, deadline %s) and its jobs were killed", r.cfg.ID, silent, r.fenceAfter, r.cfg.Deadline)
}

// readonlyVerdict is what the start-up probe found: ok, or the reason readonly jobs cannot run here.
type readonlyVerdict struct {
	ok     bool
	reason string
}

// probeReadonly runs the sandbox's readonly probe once; the runner keeps the verdict for its life.
func (r *Runner) probeReadonly(ctx context.Context) readonlyVerdict {
	err := r.mgr.ProbeReadonly(ctx)
	if err == nil {
		err = r.probeUser(ctx)
	}
	if err != nil {
		r.cfg.Logger.Warn("readonly jobs disabled", "err", err)
		return readonlyVerdict{reason: err.Error()}
	}
	return readonlyVerdict{ok: true}
}
