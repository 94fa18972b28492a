package runner

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sbx-dev/sbx/proto"
	"github.com/sbx-dev/sbx/sandbox"
)

// finalPublishWindow is how long a runner that is shutting down keeps trying to report its jobs' ends.
const finalPublishWindow = 10 * time.Second

// job is one job this runner took.
type job struct {
	id string
	// claim is the work's claim token, echoed in every event and chunk of the job.
	claim string
	// taken is when the runner took the work (sandbox.Monotonic): the origin of the job's stages.
	taken time.Duration

	mu     sync.Mutex
	proc   process // nil until started
	reason string  // why the runner stopped it; "" while it was not stopped
	why    string

	// inMu serialises writes to the job's input; inClosed is set once it is closed.
	inMu     sync.Mutex
	inClosed bool
	// tty: the job runs on a terminal, whose input is closed by typing ^D rather than by closing it.
	tty bool
	// fence is the runner's fence process when the job started: when it fired, the job was killed as
	// lost, by it or by the runner.
	fence *sandbox.Fence
}

// stop ends the job for a reason; the first reason given is the one reported. It reports whether
// this call gave the reason.
func (j *job) stop(reason, why string) bool {
	j.mu.Lock()
	first := j.reason == ""
	if first {
		j.reason, j.why = reason, why
	}
	p := j.proc
	j.mu.Unlock()
	if p != nil {
		_ = p.Kill() // an error means the process is already gone
	}
	return first
}

// signal sends a signal to the job's process group.
func (j *job) signal(sig syscall.Signal) error {
	j.mu.Lock()
	p := j.proc
	j.mu.Unlock()
	if p == nil {
		return fmt.Errorf("job %s has not started", j.id)
	}
	return p.Signal(sig)
}

// run takes one work message: it announces the job, acks the message (a command starts at most once),
// starts the process, streams its output and reports its end. It calls startOver once the start is
// over, whether it ran the command or not.
func (r *Runner) run(ctx context.Context, msg jetstream.Msg, startOver func()) {
	startOver = sync.OnceFunc(startOver)
	defer startOver()
	taken := sandbox.Monotonic()
	w, err := proto.DecodeWork(msg.Data())
	if err != nil {
		r.cfg.Logger.Error("dropping undecodable work", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return
	}
	log := r.cfg.Logger.With("job", w.JobID)
	if w.Expired(time.Now()) {
		ok, err := r.confirm(ctx, w.JobID)
		if err != nil {
			log.Warn("work is past its not_after and the coordinator did not confirm it; keeping it queued", "err", err)
			_ = msg.NakWithDelay(confirmRetry)
			return
		}
		if !ok {
			log.Info("dropping work whose start the coordinator refused")
			_ = msg.Term()
			return
		}
	}
	j := &job{id: w.JobID, claim: w.Claim, tty: w.TTY, taken: taken, fence: r.guard.Load()}
	r.mu.Lock()
	r.jobs[j.id] = j
	r.mu.Unlock()
	defer r.forget(j.id)

	if err := r.publishEvent(ctx, &proto.Event{Kind: proto.EventAccepted, JobID: j.id, Claim: j.claim, Stages: j.stages(sandbox.Stages{})}); err != nil {
		log.Warn("announce job", "err", err)
		_ = msg.Nak()
		return
	}
	if err := msg.DoubleAck(ctx); err != nil {
		// Not acked: another runner may take it. Starting it here too could run it twice.
		log.Warn("ack work", "err", err)
		return
	}
	// From here on the job is ours: report its end even when the runner is stopping.
	final := context.WithoutCancel(ctx)

	j.mu.Lock()
	stoppedEarly := j.reason
	j.mu.Unlock()
	if stoppedEarly != "" {
		r.publishEnd(ctx, final, &proto.Event{Kind: proto.EventExited, JobID: j.id, Claim: j.claim, Reason: stoppedEarly, Error: j.why, Stages: j.stages(sandbox.Stages{})})
		return
	}
	proc, err := r.start(w)
	startOver()
	if err != nil {
		log.Warn("start job", "err", err)
		r.publishEnd(ctx, final, &proto.Event{Kind: proto.EventExited, JobID: j.id, Claim: j.claim, Reason: proto.ReasonStartFailed, Error: err.Error(), Stages: j.stages(sandbox.Stages{})})
		return
	}
	j.mu.Lock()
	j.proc = proc
	stoppedEarly = j.reason
	j.mu.Unlock()
	if stoppedEarly != "" {
		_ = proc.Kill()
	}
	if w.Limits.TimeoutMS > 0 {
		timer := time.AfterFunc(time.Duration(w.Limits.TimeoutMS)*time.Millisecond, func() {
			j.stop(proto.ReasonTimeout, fmt.Sprintf("timed out after %d ms", w.Limits.TimeoutMS))
		})
		defer timer.Stop()
	}

	started := r.eventMsg(&proto.Event{Kind: proto.EventStarted, JobID: j.id, Claim: j.claim, Pid: proc.Pid(), Stages: j.stages(proc.Stages())})
	stopWatching := r.watchActivity(ctx, j, w, proc, log)
	written := r.pump(ctx, j, proc, started, w.Limits.OutputBytes, log)
	// The job's end is reported as soon as it is known; its cgroup is removed after (Wait).
	res := proc.Result()
	stopWatching()

	j.mu.Lock()
	reason, why := j.reason, j.why
	j.mu.Unlock()
	switch {
	case reason != "":
	case res.Signal == int(syscall.SIGKILL) && j.fence != nil && j.fence.Fired():
		// Killed by the fence before the runner's own check came to it.
		reason, why = proto.ReasonLost, r.fencedWhy(fmt.Sprintf("over %s", r.fenceAfter))
	case res.OOMKilled:
		reason, why = proto.ReasonOOM, "the memory limit was reached"
	case res.Signal != 0:
		reason = proto.ReasonSignal
	default:
		reason = proto.ReasonExit
	}
	code := res.ExitCode
	r.publishEnd(ctx, final, &proto.Event{
		Kind: proto.EventExited, JobID: j.id, Claim: j.claim, ExitCode: &code, Signal: res.Signal, Reason: reason, Error: why,
		OutputBytes: written,
		Usage:       &proto.Usage{CPUMS: res.CPU.Milliseconds(), MemoryPeakBytes: res.MemoryPeak},
		Stages:      j.stages(proc.Stages()),
	})
	if _, err := proc.Wait(); err != nil {
		log.Warn("clean up job", "err", err)
	}
}

// stages are the job's stages for an event made now: each as µs since the job's work was taken,
// by the one clock of this host, and SentUS now. Every stamp of st comes after taken; max keeps a
// stage from going negative, which the event's decoding refuses, whatever the clock did.
func (j *job) stages(st sandbox.Stages) *proto.Stages {
	since := func(at time.Duration) int64 {
		if at == 0 {
			return 0
		}
		return max(at-j.taken, 0).Microseconds()
	}
	return &proto.Stages{CgroupUS: since(st.Cgroup), ExecUS: since(st.Exec), ExitUS: since(st.Exit), SentUS: since(sandbox.Monotonic())}
}

// confirmRetry is how long work that could not be confirmed waits before it is delivered again.
const confirmRetry = 2 * time.Second

// confirm asks the coordinator whether the job of expired work is still to start (proto.Work.NotAfter).
// It reports an error when the coordinator does not answer: the work then stays queued.
func (r *Runner) confirm(ctx context.Context, id string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := r.nc.RequestWithContext(ctx, proto.ConfirmSubject(r.cfg.ID), proto.Encode(&proto.Control{V: proto.Version, Op: proto.OpConfirm, JobID: id}))
	if err != nil {
		return false, fmt.Errorf("confirm %s: %w", id, err)
	}
	reply, err := proto.DecodeControlReply(m.Data)
	if err != nil {
		return false, err
	}
	switch reply.Code {
	case proto.ReplyOK:
		return true, nil
	case proto.ReplyUnknownJob:
		return false, nil
	}
	return false, fmt.Errorf("confirm %s: %s: %s", id, reply.Code, reply.Message)
}

// start starts the job's shell in its cgroup, or opens its source. A readonly job runs in the readonly sandbox or not at
// all: on a runner whose probe failed it fails to start, whatever subject it came on.
func (r *Runner) start(w *proto.Work) (process, error) {
	if w.Readonly && !r.readonly.ok {
		return nil, fmt.Errorf("runner %s cannot run readonly jobs: %s", r.cfg.ID, r.readonly.reason)
	}
	if w.Source != nil {
		src, err := dialSource(w.Source)
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return src, nil
	}
	dir, err := os.Stat(w.Cwd)
	if err != nil || !dir.IsDir() {
		return nil, fmt.Errorf("cwd %s is not a directory on runner %s", w.Cwd, r.cfg.ID)
	}
	acct, err := r.account(w.User, dir)
	if err != nil {
		return nil, err
	}
	extra := w.Env
	var cred *sandbox.Credential
	if acct != nil {
		cred = acct.cred
		extra = acct.env()
		for k, v := range w.Env {
			extra[k] = v
		}
	}
	if w.TTY {
		extra = withTerm(extra)
	}
	env := r.environ(extra)
	if w.Readonly {
		env = r.readonlyEnv(extra)
	}
	shell, err := r.shell(w.Shell)
	if err != nil {
		return nil, err
	}
	return r.mgr.Start(sandbox.Spec{
		Credential:     cred,
		Linger:         w.Linger,
		LingerCgroup:   w.LingerCgroup,
		Stdin:          w.Stdin,
		SeparateStderr: w.SeparateStderr,
		ID:             w.JobID,
		Path:           shell,
		Args:           []string{filepath.Base(shell), "-c", w.Command},
		Dir:            w.Cwd,
		Env:            env,
		Resources:      resources(w.Limits),
		Readonly:       w.Readonly,
		TTY:            w.TTY,
		TTYSize:        ttySize(w.TTYSize),
	})
}

// ttyTerm is TERM on a job's terminal unless the job sets its own: the escape sequences it allows
// are stripped again where sbx matches text, and a tool that sees "dumb" leaves out what a
// terminal is asked for (prompts redrawn, progress bars).
const ttyTerm = "xterm-256color"

// withTerm is extra with TERM set to ttyTerm, unless it sets TERM itself.
func withTerm(extra map[string]string) map[string]string {
	if _, ok := extra["TERM"]; ok {
		return extra
	}
	out := make(map[string]string, len(extra)+1)
	for k, v := range extra {
		out[k] = v
	}
	out["TERM"] = ttyTerm
	return out
}

// ttySize is the terminal size a work message asks for (nil: the default).
func ttySize(s *proto.TTYSize) sandbox.TTYSize {
	if s == nil {
		return sandbox.TTYSize{Rows: proto.DefaultTTYRows, Cols: proto.DefaultTTYCols}
	}
	return sandbox.TTYSize{Rows: uint16(s.Rows), Cols: uint16(s.Cols)}
}

// shell resolves the shell a job asked for: the runner's default, /bin/sh, or bash from PATH.
func (r *Runner) shell(name string) (string, error) {
	switch name {
	case "":
		return r.cfg.Shell, nil
	case proto.ShellSh:
		return "/bin/sh", nil
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s is not installed on runner %s", name, r.cfg.ID)
	}
	return path, nil
}

// readonlyBase lists the variables a readonly job takes from the runner's environment, with the value
// it gets when the runner has none. Nothing else of the runner's environment reaches it.
var readonlyBase = []struct{ key, fallback string }{
	{"PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	{"HOME", "/"},
	{"LANG", "C.UTF-8"},
	{"TERM", "dumb"},
}

// readonlyEnv is a readonly job's environment: readonlyBase from the runner's, overlaid with the
// job's own variables.
func (r *Runner) readonlyEnv(extra map[string]string) []string {
	base := make([]string, 0, len(readonlyBase))
	for _, b := range readonlyBase {
		v := b.fallback
		for _, kv := range r.cfg.Environ {
			if k, val, _ := strings.Cut(kv, "="); k == b.key && val != "" {
				v = val
			}
		}
		base = append(base, b.key+"="+v)
	}
	return overlay(base, extra)
}

// environ is the runner's environment without what is the runner's own (see inherited), overlaid
// with the job's own.
func (r *Runner) environ(extra map[string]string) []string {
	env := make([]string, 0, len(r.cfg.Environ))
	for _, kv := range r.cfg.Environ {
		if r.inherited(kv) {
			env = append(env, kv)
		}
	}
	return overlay(env, extra)
}

// inherited reports whether a plain job may inherit a variable of the runner's environment: not
// sbx's own (SBX_*), not NATS's (NATS_*: a URL with a password, a creds path), and not one whose value
// names one of the runner's Secrets.
func (r *Runner) inherited(kv string) bool {
	k, v, _ := strings.Cut(kv, "=")
	if strings.HasPrefix(k, "SBX_") || strings.HasPrefix(k, "NATS_") {
		return false
	}
	for _, s := range r.cfg.Secrets {
		if strings.Contains(v, s) {
			return false
		}
	}
	return true
}

// overlay is base without the variables extra names, then extra's in key order.
func overlay(base []string, extra map[string]string) []string {
	env := make([]string, 0, len(base)+len(extra))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, overridden := extra[k]; !overridden {
			env = append(env, kv)
		}
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		env = append(env, k+"="+extra[k])
	}
	return env
}

// cpuPeriod is the CFS period used for CPU limits, in microseconds.
const cpuPeriod = 100_000

// resources turns a job's limits into OCI resources; nil when there are none.
func resources(l proto.Limits) *specs.LinuxResources {
	if l.MemoryBytes == 0 && l.CPUMillicores == 0 && l.Pids == 0 {
		return nil
	}
	res := &specs.LinuxResources{}
	if l.MemoryBytes > 0 {
		m := l.MemoryBytes
		res.Memory = &specs.LinuxMemory{Limit: &m, Swap: &m}
	}
	if l.CPUMillicores > 0 {
		quota := l.CPUMillicores * cpuPeriod / 1000
		period := uint64(cpuPeriod)
		res.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	if l.Pids > 0 {
		res.Pids = &specs.LinuxPids{Limit: &l.Pids}
	}
	return res
}

// publishEvent publishes a state event, retrying until it is stored or ctx ends.
func (r *Runner) publishEvent(ctx context.Context, e *proto.Event) error {
	return r.publishSync(ctx, r.eventMsg(e))
}

// eventMsg stamps a state event and makes its message, de-duplicated by job and kind.
func (r *Runner) eventMsg(e *proto.Event) *nats.Msg {
	e.V, e.Runner, e.Time = proto.Version, r.cfg.ID, time.Now()
	msg := &nats.Msg{Subject: proto.StateSubject(r.cfg.ID, e.JobID), Data: proto.Encode(e), Header: nats.Header{}}
	msg.Header.Set(proto.HeaderMsgID, e.MsgID())
	return msg
}

// forget drops a job from the runner's table: control requests no longer find it.
func (r *Runner) forget(id string) {
	r.mu.Lock()
	delete(r.jobs, id)
	r.mu.Unlock()
}

// publishEnd forgets the job and reports its end; once the runner is stopping it tries for
// finalPublishWindow more.
func (r *Runner) publishEnd(ctx, final context.Context, e *proto.Event) {
	r.forget(e.JobID)
	pctx, cancel := r.finalContext(ctx, final)
	defer cancel()
	if err := r.publishEvent(pctx, e); err != nil {
		r.cfg.Logger.Error("report job end", "job", e.JobID, "err", err)
	}
}

// finalContext is final while ctx lives, and final bounded by finalPublishWindow once ctx ended.
func (r *Runner) finalContext(ctx, final context.Context) (context.Context, context.CancelFunc) {
	pctx, cancel := context.WithCancel(final)
	stop := context.AfterFunc(ctx, func() {
		time.AfterFunc(finalPublishWindow, cancel)
	})
	return pctx, func() { stop(); cancel() }
}

// publishSync publishes one message and waits for the stream to store it, retrying with backoff.
// The message's Nats-Msg-Id makes a retry of a stored message harmless.
func (r *Runner) publishSync(ctx context.Context, msg *nats.Msg) error {
	backoff := 50 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := r.js.PublishMsg(actx, msg)
		cancel()
		if err == nil {
			return nil
		}
		r.cfg.Logger.Warn("publish", "subject", msg.Subject, "err", err)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return fmt.Errorf("publish %s: %w", msg.Subject, err)
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}
