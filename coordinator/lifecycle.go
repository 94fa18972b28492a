package coordinator

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/sbx-dev/sbx/proto"
)

// lifecycle is the part of the coordinator that owns the jobs not ended: their state machine
// (queued, running, ended), the runners' events and output chunks applied to them, their waiters
// (observers) and their end. Its guarantees, each held under its one mutex:
//
//   - A job ends once (finishLocked): its notifications, its footer and its ended record are
//     written, then it leaves live, all under lc.mu; an event of an ended job finds it gone.
//   - A job ends only once its output is whole (event: an exit waits for missing chunks up to
//     missingOutputGrace).
//   - Its end notifies exactly once, and never when observed: whether a caller waits for the end
//     right now (observers, ownerKill) is decided in the same step as the end (finishLocked), and
//     an observer that leaves without reporting the end stores the notification after all
//     (unobserve).
//   - A runner message about a job is its runner's (checkOwnerLocked): anything else is ErrForged.
//
// It is first in the lock order (service.go): holding lc.mu it asks the fleet for stray kills and
// the queued reason, stores notifications through the sessions' part and counts output in the
// budget; none of those calls back into it.
type lifecycle struct {
	cfg      *Config
	store    Store
	out      OutputStore
	fleet    *fleet
	sessions *sessionBook
	budget   *retention

	mu    sync.Mutex
	live  map[string]*liveJob // every job not yet ended
	stats Stats               // its counters: JobsStarted, JobsEnded, Events, OutputBytes, Forged
}

// newLifecycle loads the unfinished jobs of an earlier life from the store, their output on disk
// counted in the budget.
func newLifecycle(ctx context.Context, cfg *Config, store Store, out OutputStore, f *fleet, sessions *sessionBook, budget *retention) (*lifecycle, error) {
	lc := &lifecycle{
		cfg: cfg, store: store, out: out, fleet: f, sessions: sessions, budget: budget,
		live:  map[string]*liveJob{},
		stats: Stats{JobsEnded: map[Status]int64{}, Forged: map[string]int64{}},
	}
	unfinished, err := store.UnfinishedJobs(ctx)
	if err != nil {
		return nil, err
	}
	now := cfg.Now()
	for _, j := range unfinished {
		size, err := out.Size(j.ID)
		if err != nil {
			return nil, err
		}
		// Output matching resumes at the end of what is on disk: what was before was matched in
		// the earlier life.
		lc.live[j.ID] = &liveJob{job: j, size: size, changed: make(chan struct{}), watch: newOutputWatch(j, cfg), lastGrowth: now}
		budget.grew(size)
	}
	return lc, nil
}

// add records a new job: its session opened (reopened when it had ended), the job stored, then
// live. observe counts the caller among its observers from now on, so that a job that ends before
// the caller's wait begins is seen too. The session is opened under lc.mu, so that a session's
// end (endSession) comes wholly before or after.
func (lc *lifecycle) add(ctx context.Context, job *Job, accepted time.Time, observe bool) (*liveJob, error) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if err := lc.sessions.open(ctx, job.Session); err != nil {
		return nil, err
	}
	if err := lc.store.PutJob(ctx, job); err != nil {
		return nil, err
	}
	l := &liveJob{job: job, changed: make(chan struct{}), watch: newOutputWatch(job, lc.cfg), lastGrowth: job.CreatedAt, clock: clock{accepted: accepted}}
	l.clock.stored = l.clock.since(time.Now()) // stored with the job's next change, as WorkSeq
	l.retimeLocked()
	if observe {
		l.observers++
	}
	lc.live[job.ID] = l
	lc.stats.JobsStarted++
	return l, nil
}

// dispatched records the work's sequence in the work stream; it is stored with the job's next
// change.
func (lc *lifecycle) dispatched(l *liveJob, seq uint64) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	l.job.WorkSeq = seq
	l.clock.published = l.clock.since(time.Now())
	l.retimeLocked()
}

// notQueued ends a job whose work could not be queued, quietly: its caller gets the error instead.
func (lc *lifecycle) notQueued(ctx context.Context, l *liveJob, err error) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	l.job.end(lc.cfg.Now(), proto.ReasonStartFailed, nil)
	l.job.Error = "The job could not be queued: " + err.Error()
	l.quiet = true
	if err := lc.finishLocked(ctx, l); err != nil {
		lc.cfg.Logger.Error("end a job that could not be queued", "job", l.job.ID, "err", err)
	}
}

// copyLocked returns a copy of a live job that the caller may keep, with its body size. lc.mu is
// held; the queued reason, the fleet's, is filled in by the caller after (queuedReason).
func (lc *lifecycle) copyLocked(l *liveJob) *Job {
	j := *l.job
	j.OutputBytes = l.size
	return &j
}

// snapshot returns a copy of job id that the caller may keep: the live job keeps changing; fallback
// when it is no longer live.
func (lc *lifecycle) snapshot(id string, fallback *Job) *Job {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if l, ok := lc.live[id]; ok {
		j := lc.copyLocked(l)
		j.QueuedReason = lc.fleet.queuedReason(j)
		return j
	}
	j := *fallback
	return &j
}

// current returns the job's current state, its body size and a channel closed at its next change;
// the channel is nil once the job has ended.
func (lc *lifecycle) current(ctx context.Context, id string) (*Job, int64, <-chan struct{}, error) {
	lc.mu.Lock()
	if l, ok := lc.live[id]; ok {
		j := lc.copyLocked(l)
		j.QueuedReason = lc.fleet.queuedReason(j)
		size, ch := l.size, l.changed
		lc.mu.Unlock()
		return j, size, ch, nil
	}
	lc.mu.Unlock()
	if !proto.ValidToken(id) {
		return nil, 0, nil, Errorf(ENOTFOUND, "Job %q does not exist.", id)
	}
	j, err := lc.store.Job(ctx, id)
	if err != nil {
		return nil, 0, nil, err
	}
	return j, j.OutputBytes, nil, nil
}

// observe counts a caller among job id's observers and returns the job, nil when it is not live.
// The caller uncounts itself with unobserve.
func (lc *lifecycle) observe(id string) *liveJob {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	l := lc.live[id]
	if l != nil {
		l.observers++
	}
	return l
}

// observers is how many callers wait for job id's end right now.
func (lc *lifecycle) observers(id string) int {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if l := lc.live[id]; l != nil {
		return l.observers
	}
	return 0
}

// ownKill marks a stop of job id asked for by its own session, so that its end counts as observed,
// and reports whether this call marked it (the caller unmarks it with unownKill should the stop
// fail).
func (lc *lifecycle) ownKill(session, id string) bool {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	own := false
	if l, ok := lc.live[id]; ok && session != "" && l.job.Session == session {
		own, l.ownerKill = !l.ownerKill, true
	}
	return own
}

// unownKill undoes ownKill: the stop failed, so the end notifies again.
func (lc *lifecycle) unownKill(id string) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if l, ok := lc.live[id]; ok {
		l.ownerKill = false
	}
}

// placed returns the runner of live job id ("" while none took it) and its work's sequence; ok is
// false once it ended.
func (lc *lifecycle) placed(id string) (runner string, seq uint64, ok bool) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	l, ok := lc.live[id]
	if !ok {
		return "", 0, false
	}
	return l.job.Runner, l.job.WorkSeq, true
}

// withdrawn ends job id, whose work was withdrawn from the queue, unless a runner took it or it
// ended meanwhile: killed, or session_ended when its session's end withdrew it.
func (lc *lifecycle) withdrawn(ctx context.Context, id string) error {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	l, ok := lc.live[id]
	if !ok || l.job.Runner != "" {
		return nil
	}
	reason := proto.ReasonKilled
	if l.sessionEnded {
		reason = proto.ReasonSessionEnded
	}
	l.job.end(lc.cfg.Now(), reason, nil)
	return lc.finishLocked(ctx, l)
}

// endSession ends session id and marks its live jobs: each ends session_ended and notifies
// nothing. It returns their ids, for the caller to stop them. The session's end and the marks are
// one step under lc.mu, so that a start in the session (add) comes before (its job is marked here)
// or after (it reopens the session).
func (lc *lifecycle) endSession(ctx context.Context, id string) ([]string, error) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if err := lc.sessions.end(ctx, id); err != nil {
		return nil, err
	}
	ids := []string{}
	for jid, l := range lc.live {
		if l.job.Session == id {
			l.sessionEnded, l.quiet = true, true
			ids = append(ids, jid)
		}
	}
	return ids, nil
}

// resized records a live tty job's new terminal size, and stores it.
func (lc *lifecycle) resized(ctx context.Context, id string, size TTYSize) error {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if l, ok := lc.live[id]; ok {
		l.job.TTYSize = &size
		if err := lc.store.PutJob(ctx, l.job); err != nil {
			return err
		}
		l.wake()
	}
	return nil
}

// fillStats copies the part's counters into st.
func (lc *lifecycle) fillStats(st *Stats) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	st.JobsStarted, st.Events, st.OutputBytes = lc.stats.JobsStarted, lc.stats.Events, lc.stats.OutputBytes
	st.JobsEnded = make(map[Status]int64, len(lc.stats.JobsEnded))
	for k, v := range lc.stats.JobsEnded {
		st.JobsEnded[k] = v
	}
	st.Forged = make(map[string]int64, len(lc.stats.Forged))
	for k, v := range lc.stats.Forged {
		st.Forged[k] = v
	}
	st.JobsLive = len(lc.live)
}

// liveJob is the in-memory state of a job that has not ended. Every field, and its job's, is
// read and written under lifecycle.mu; the front holds a *liveJob only as a handle to give back
// (wait, unobserve).
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

// unobserve uncounts an observer of l. When the job's end was observed but the last observer leaves
// without having reported it (it gave up, its caller went away), the finished notification is
// stored after all, so that the end is never lost.
func (lc *lifecycle) unobserve(l *liveJob, sawEnd bool) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	l.observers--
	if sawEnd {
		l.endSeen = true
	}
	if l.observers > 0 || !l.job.Observed || l.endSeen || l.ownerKill || l.quiet || l.endNotified() {
		return
	}
	l.endSeen = true // once
	n := finishedNote(l.job)
	if err := lc.sessions.deliver(context.Background(), l.job, []note{n}); err != nil {
		lc.cfg.Logger.Error("store finished notification", "job", l.job.ID, "err", err)
	}
}

// forged counts a forged runner message of a kind and returns ErrForged wrapped with why.
func (lc *lifecycle) forged(kind, why string) error {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return lc.forgedLocked(kind, why)
}

func (lc *lifecycle) forgedLocked(kind, why string) error {
	lc.stats.Forged[kind]++
	return fmt.Errorf("%w: %s", ErrForged, why)
}

// checkOwnerLocked fails with ErrForged unless a message from runner with claim may be about job
// j: the claim must be the job's (a job of an earlier version has none to check), and once the job
// started, the runner must be the one that started it. Before the start a runner with the right
// claim may differ from the one that announced the job: work whose ack was lost goes to another
// runner. lc.mu is held.
func (lc *lifecycle) checkOwnerLocked(j *Job, kind, runner, claim string) error {
	if j.Claim != "" && claim != j.Claim {
		return lc.forgedLocked(kind, fmt.Sprintf("job %s: runner %s sent a wrong claim", j.ID, runner))
	}
	if j.StartedAt != nil && runner != j.Runner {
		return lc.forgedLocked(kind, fmt.Sprintf("job %s runs on runner %s, not on %s", j.ID, j.Runner, runner))
	}
	return nil
}

// missingOutputGrace is how long an exit event waits for output chunks that have not arrived.
const missingOutputGrace = 30 * time.Second

// event applies a runner's state event (Service.HandleEvent), holding lc.mu across the store's
// writes: an event is acked only once its change is stored.
func (lc *lifecycle) event(ctx context.Context, e *Event) error {
	received := time.Now()
	lc.mu.Lock()
	defer lc.mu.Unlock()
	l, ok := lc.live[e.JobID]
	if ok {
		if err := lc.checkOwnerLocked(l.job, ForgedState, e.Runner, e.Claim); err != nil {
			return err
		}
	}
	lc.stats.Events++
	if !ok {
		// An ended or unknown job. A start after the end (killed while being taken, or lost and
		// then found) must not leave a process running.
		if e.Kind == proto.EventAccepted || e.Kind == proto.EventStarted {
			lc.fleet.stopStray(e.Runner, e.JobID)
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
		if err := lc.out.Begin(j); err != nil {
			return err
		}
		l.lastGrowth = lc.cfg.Now()
	case proto.EventActivity:
		return lc.activityLocked(ctx, l, e)
	case proto.EventExited:
		// Every chunk was stored before the exit event, but one can come back later (a retried
		// publish, a redelivery): the job ends only once its output is whole, or after
		// missingOutputGrace, with what arrived.
		if l.size < e.OutputBytes {
			now := lc.cfg.Now()
			if l.exitSeen.IsZero() {
				l.exitSeen = now
			}
			if now.Sub(l.exitSeen) < missingOutputGrace {
				return ErrNotReady
			}
			lc.cfg.Logger.Error("job ends with output missing", "job", j.ID, "have", l.size, "want", e.OutputBytes)
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
		return lc.finishLocked(ctx, l)
	}
	if err := lc.store.PutJob(ctx, j); err != nil {
		return err
	}
	l.wake()
	return nil
}

// queued reports whether job id is queued here and not yet taken (Service.ConfirmStart).
func (lc *lifecycle) queued(id string) bool {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	l, ok := lc.live[id]
	return ok && l.job.Status == StatusQueued
}

// finishLocked stores an ended job's notifications, writes its footer and record and wakes its
// waiters. lc.mu is held.
//
// The finished notification is decided here, in the same step as the end: if a caller is waiting
// for the end right now, it sees the end and no notification is stored (the job is marked
// observed); otherwise the notification is stored before the job is, and before the event is acked.
// Pending output notifications go first. A job whose session ended notifies nothing.
func (lc *lifecycle) finishLocked(ctx context.Context, l *liveJob) error {
	j := l.job
	if j.OutputBytes < l.size {
		j.OutputBytes = l.size
	}
	j.Ports = nil // nothing of the job listens any more
	if !l.quiet {
		var notes []note
		if l.watch != nil {
			l.watch.end(lc.cfg.Now())
			notes = l.watch.take()
		}
		if l.observers > 0 || l.ownerKill {
			j.Observed = true
		} else if !l.endNotified() {
			notes = append(notes, finishedNote(j))
		}
		if err := lc.sessions.deliver(ctx, l.job, notes); err != nil {
			return err
		}
	}
	if j.StartedAt == nil {
		if err := lc.out.Begin(j); err != nil {
			return err
		}
	}
	if err := lc.out.End(j); err != nil {
		return err
	}
	l.clock.exitStored = l.clock.since(time.Now())
	l.retimeLocked()
	if err := lc.store.PutJob(ctx, j); err != nil {
		return err
	}
	delete(lc.live, j.ID)
	lc.stats.JobsEnded[j.Status]++
	lc.budget.ended(l.size, j.OutputBytes)
	l.wake()
	return nil
}

// chunk writes a piece of output into the job's terminal file (Service.HandleChunk). The file is
// written without lc.mu; the body's growth is applied under it.
func (lc *lifecycle) chunk(ctx context.Context, c *Chunk) error {
	lc.mu.Lock()
	l, ok := lc.live[c.JobID]
	if ok && l.job.StartedAt == nil {
		lc.mu.Unlock()
		return ErrNotReady
	}
	if ok {
		if err := lc.checkOwnerLocked(l.job, ForgedOutput, c.Runner, c.Claim); err != nil {
			lc.mu.Unlock()
			return err
		}
	}
	lc.mu.Unlock()
	if !ok {
		// A redelivered chunk of an ended job is still written when it lies inside the output, and
		// comes from the runner that ran the job.
		j, err := lc.store.Job(ctx, c.JobID)
		if err != nil || c.Offset+int64(len(c.Data)) > j.OutputBytes {
			return nil
		}
		if j.Claim != "" && (c.Claim != j.Claim || c.Runner != j.Runner) {
			return lc.forged(ForgedOutput, fmt.Sprintf("job %s ended: runner %s sent output that is not its own", j.ID, c.Runner))
		}
		return lc.out.Write(c.JobID, c.Offset, c.Data)
	}
	if err := lc.out.Write(c.JobID, c.Offset, c.Data); err != nil {
		return err
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	lc.stats.OutputBytes += int64(len(c.Data))
	old, end := l.size, c.Offset+int64(len(c.Data))
	if c.Stderr && l.watch != nil && end > l.size {
		l.errSpans = append(l.errSpans, span{c.Offset, end})
	}
	if l.wrote(c.Offset, end) {
		if old == 0 {
			l.clock.firstOutput = l.clock.since(time.Now())
			l.retimeLocked()
		}
		if lc.budget.grew(l.size-old) && !l.budgetCut && l.job.Runner != "" {
			// The job that writes past the budget is stopped; quiet jobs go on.
			l.budgetCut = true
			lc.cfg.Logger.Warn("output budget reached: stopping the job writing", "job", l.job.ID, "budget", lc.cfg.OutputBudget)
			lc.fleet.stopStray(l.job.Runner, l.job.ID)
		}
		l.lastGrowth, l.stallChecked = lc.cfg.Now(), false
		if err := lc.watchOutputLocked(ctx, l, old, c); err != nil {
			return err
		}
		l.wake()
	}
	return nil
}

// watchOutputLocked hands the body's newly contiguous bytes [old, l.size) to the job's watch and
// stores what it notifies. The chunk's own bytes are used when they are exactly the new part;
// otherwise (the chunk closed a gap) the new part is read back from the file. lc.mu is held.
func (lc *lifecycle) watchOutputLocked(ctx context.Context, l *liveJob, old int64, c *Chunk) error {
	if l.watch == nil || l.quiet {
		return nil
	}
	data := c.Data
	if c.Offset != old || c.Offset+int64(len(c.Data)) != l.size {
		rc, err := lc.out.Open(l.job.ID, old, l.size-old)
		if err != nil {
			return err
		}
		data, err = io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
	}
	l.feedWatch(data, old, lc.cfg.Now())
	if err := lc.sessions.deliver(ctx, l.job, l.watch.take()); err != nil {
		return err
	}
	if l.watch.monStopped && !l.watch.monKillAsked && l.job.Runner != "" {
		l.watch.monKillAsked = true
		lc.fleet.stopStray(l.job.Runner, l.job.ID)
	}
	return nil
}

// touchHeaders rewrites the running_for_ms of the running jobs' headers.
func (lc *lifecycle) touchHeaders() {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	now := lc.cfg.Now()
	for _, l := range lc.live {
		if l.job.Status == StatusRunning {
			if err := lc.out.Touch(l.job, now.Sub(*l.job.StartedAt)); err != nil {
				lc.cfg.Logger.Warn("rewrite header", "job", l.job.ID, "err", err)
			}
		}
	}
}

// markLost ends, as lost, the jobs of runners that went silent or restarted and the jobs taken but
// never started. Silence counts only while the coordinator's own link was up (checkLink).
func (lc *lifecycle) markLost(ctx context.Context) {
	linkUp, ok := lc.fleet.checkLink(ctx)
	if !ok {
		return
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	now := lc.cfg.Now()
	// The runners are looked at once, under the jobs' lock: a heartbeat that comes meanwhile is
	// applied as if after this pass.
	runners := lc.fleet.sweep(now, linkUp)
	for _, l := range lc.live {
		j := l.job
		if j.Runner == "" {
			continue
		}
		r, known := runners[j.Runner]
		var why string
		switch {
		case !known && now.Sub(later(lc.fleet.start, linkUp)) > lc.cfg.RunnerDeadline:
			why = "its runner " + j.Runner + " stopped sending heartbeats"
		case known && j.AcceptedAt != nil && j.AcceptedAt.Before(r.Boot):
			why = "its runner " + j.Runner + " restarted"
		case j.StartedAt == nil && j.AcceptedAt != nil && now.Sub(later(*j.AcceptedAt, linkUp)) > lc.cfg.StartDeadline:
			why = "it was taken by runner " + j.Runner + " but never started"
		default:
			continue
		}
		j.Error = "Lost: " + why + "."
		j.end(now, proto.ReasonLost, nil)
		if err := lc.finishLocked(ctx, l); err != nil {
			lc.cfg.Logger.Error("mark job lost", "job", j.ID, "err", err)
		}
	}
}
