package coordinator

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/sbx-dev/sbx/proto"
)

// Runner is what the coordinator knows of a runner from its heartbeats.
type Runner struct {
	ID             string            `json:"id"`
	Pool           string            `json:"pool"`
	Slots          int               `json:"slots"`
	Running        int               `json:"running"`
	Readonly       bool              `json:"readonly"`
	ReadonlyReason string            `json:"readonly_reason,omitempty"`
	Cgroup         string            `json:"cgroup"`
	Labels         map[string]string `json:"labels,omitempty"`
	LastSeen       time.Time         `json:"last_seen"`
	Version        string            `json:"version"`
	Boot           time.Time         `json:"boot"`
	// Draining: the runner was told to stop; it takes no more work and lets its jobs finish.
	Draining bool `json:"draining"`
}

// HandleHeartbeat records a runner's heartbeat and fences the jobs it lists that must not run
// there (fence.go). A new boot time means the runner restarted: the jobs it had taken before are
// lost (markLost ends them).
func (s *Service) HandleHeartbeat(h *Heartbeat) {
	s.fleet.heartbeat(h)
	s.jobs.fence(h.Runner, h.Jobs)
}

// Runners lists the live runners by id.
func (s *Service) Runners() []Runner {
	return s.fleet.list()
}

// fleet is the part of the coordinator that owns runner membership: the live runners as their
// heartbeats describe them, the coordinator's own link to them (checkLink: silence heard through a
// broken link says nothing of the runners), which runners are gone (sweep), and the kill requests
// sent in the background for jobs that must not run (stopStray: one in flight per job, waited for
// by Run). What a runner is told to kill is decided by the jobs' part (fence.go).
//
// It calls no other part. In the lock order (service.go) it comes after the jobs' part: a job's
// end or a chunk past the budget asks for a stray kill while the jobs' lock is held.
type fleet struct {
	cfg   *Config
	disp  Dispatcher
	start time.Time

	// strays are the kill requests sent to runners in the background (stopStray); Run waits for them.
	strays sync.WaitGroup

	mu      sync.Mutex
	runners map[string]*Runner
	// stopping are the jobs a stray kill request is in flight for (stopStray): one at a time per job.
	stopping map[string]bool
	// linkUp is since when the coordinator's own link has been up without a break (checkLink);
	// zero while it is down or not yet checked.
	linkUp time.Time
}

func newFleet(cfg *Config, disp Dispatcher, start time.Time) *fleet {
	return &fleet{cfg: cfg, disp: disp, start: start, runners: map[string]*Runner{}, stopping: map[string]bool{}}
}

// heartbeat records a runner's heartbeat. A new boot time means the runner restarted: the jobs it
// had taken before are lost (markLost ends them).
func (f *fleet) heartbeat(h *Heartbeat) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runners[h.Runner] = &Runner{
		ID: h.Runner, Pool: h.Pool, Slots: h.Slots, Running: h.Running, Readonly: h.Readonly,
		ReadonlyReason: h.ReadonlyReason, Cgroup: h.Cgroup, Labels: h.Labels, LastSeen: f.cfg.Now(),
		Version: h.Version, Boot: h.Boot, Draining: h.Draining,
	}
}

// list returns the live runners by id.
func (f *fleet) list() []Runner {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Runner, 0, len(f.runners))
	for _, r := range f.runners {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, k int) bool { return out[i].ID < out[k].ID })
	return out
}

// count is how many runners are live.
func (f *fleet) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.runners)
}

// queuedReason says what keeps a queued job from starting: no runner of its pool (able to run it)
// is connected, or every slot of those that are is busy; "" when nothing does (a runner with a
// free slot takes it shortly) and once a runner took it.
func (f *fleet) queuedReason(j *Job) string {
	if j.Status != StatusQueued || j.Runner != "" {
		return ""
	}
	kind := "runner"
	if j.Readonly {
		kind = "readonly-capable runner"
	}
	f.mu.Lock()
	runners, slots, running := 0, 0, 0
	for _, r := range f.runners {
		if r.Pool != j.Pool || j.Readonly && !r.Readonly || r.Draining {
			continue
		}
		runners++
		slots += r.Slots
		running += r.Running
	}
	f.mu.Unlock()
	switch {
	case runners == 0:
		return fmt.Sprintf("No %s of pool %s is connected; the job starts when one joins.", kind, j.Pool)
	case running >= slots:
		return fmt.Sprintf("Every slot of pool %s is busy (%d of %d on %d runners); the job starts when one frees.", j.Pool, running, slots, runners)
	}
	return "" // a runner with a free slot takes it shortly
}

// readonlyAvailable fails unless a live runner of the pool passed its sandbox probe. A readonly job
// must never wait for, or run on, a runner that cannot confine it.
func (f *fleet) readonlyAvailable(pool string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	reason := "no runner of pool " + pool + " is connected"
	for _, r := range f.runners {
		if r.Pool != pool {
			continue
		}
		if r.Readonly {
			return nil
		}
		reason = "runner " + r.ID + ": " + r.ReadonlyReason
	}
	return Errorf(EREADONLYUNAVAILABLE, "No runner can run readonly jobs (%s).", reason)
}

// linkChecker is implemented by a Dispatcher that can tell whether the coordinator reaches the
// runners' bus right now (a round trip to NATS).
type linkChecker interface {
	CheckLink(ctx context.Context) error
}

// linkCheckTimeout bounds one check of the coordinator's own link.
const linkCheckTimeout = 2 * time.Second

// checkLink checks the coordinator's own link to the runners, when the dispatcher can, and reports
// since when it has been up without a break (f.start when it cannot tell), or false while it is
// down. Silence heard through a broken link says nothing of the runners: deadlines count from
// when the link is back. The round trip is made without f.mu.
func (f *fleet) checkLink(ctx context.Context) (time.Time, bool) {
	lc, ok := f.disp.(linkChecker)
	if !ok {
		return f.start, true
	}
	cctx, cancel := context.WithTimeout(ctx, linkCheckTimeout)
	err := lc.CheckLink(cctx)
	cancel()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		if !f.linkUp.IsZero() {
			f.cfg.Logger.Warn("the coordinator cannot reach NATS: no job is marked lost until it can", "err", err)
		}
		f.linkUp = time.Time{}
		return time.Time{}, false
	}
	if f.linkUp.IsZero() {
		f.linkUp = f.cfg.Now()
	}
	return f.linkUp, true
}

// sweep forgets the runners silent for longer than RunnerDeadline by now, their silence counted
// from linkUp at the earliest, and returns a copy of those left.
func (f *fleet) sweep(now, linkUp time.Time) map[string]Runner {
	f.mu.Lock()
	defer f.mu.Unlock()
	left := make(map[string]Runner, len(f.runners))
	for id, r := range f.runners {
		if now.Sub(later(r.LastSeen, linkUp)) > f.cfg.RunnerDeadline {
			f.cfg.Logger.Warn("runner gone", "runner", id, "last_seen", r.LastSeen)
			delete(f.runners, id)
			continue
		}
		left[id] = *r
	}
	return left
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

// stopStray asks a runner, in the background, to kill a job the coordinator already considers
// ended (or a monitor it stopped, one fenced: fence.go, one past the output budget). A job with a
// request in flight gets no second one. Run waits for these requests when it returns (wait).
func (f *fleet) stopStray(runner, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopping[id] {
		return
	}
	f.stopping[id] = true
	f.strays.Add(1)
	go func() {
		defer f.strays.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		reply, err := f.disp.Control(ctx, runner, &Control{Op: proto.OpKill, JobID: id})
		f.mu.Lock()
		delete(f.stopping, id)
		f.mu.Unlock()
		switch {
		case err != nil:
			f.cfg.Logger.Warn("stop stray job", "job", id, "runner", runner, "err", err)
		case reply.Code == proto.ReplyOK:
			f.cfg.Logger.Info("stopped stray job", "job", id, "runner", runner)
		}
	}()
}

// wait returns once every kill request stopStray sent is answered or timed out.
func (f *fleet) wait() { f.strays.Wait() }
