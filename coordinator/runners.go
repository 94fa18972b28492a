package coordinator

import (
	"fmt"
	"sort"
	"time"
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

// HandleHeartbeat records a runner's heartbeat. A new boot time means the runner restarted: the jobs
// it had taken before are lost (markLost ends them).
func (s *Service) HandleHeartbeat(h *Heartbeat) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runners[h.Runner] = &Runner{
		ID: h.Runner, Pool: h.Pool, Slots: h.Slots, Running: h.Running, Readonly: h.Readonly,
		ReadonlyReason: h.ReadonlyReason, Cgroup: h.Cgroup, Labels: h.Labels, LastSeen: s.cfg.Now(),
		Version: h.Version, Boot: h.Boot, Draining: h.Draining,
	}
	s.fenceLocked(h.Runner, h.Jobs)
}

// Runners lists the live runners by id.
func (s *Service) Runners() []Runner {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Runner, 0, len(s.runners))
	for _, r := range s.runners {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, k int) bool { return out[i].ID < out[k].ID })
	return out
}

// queuedReasonLocked says what keeps a queued job from starting: no runner of its pool (able to run
// it) is connected, or every slot of those that are is busy; "" when nothing does (a runner with a
// free slot takes it shortly) and once a runner took it. s.mu is held.
func (s *Service) queuedReasonLocked(j *Job) string {
	if j.Status != StatusQueued || j.Runner != "" {
		return ""
	}
	kind := "runner"
	if j.Readonly {
		kind = "readonly-capable runner"
	}
	runners, slots, running := 0, 0, 0
	for _, r := range s.runners {
		if r.Pool != j.Pool || j.Readonly && !r.Readonly || r.Draining {
			continue
		}
		runners++
		slots += r.Slots
		running += r.Running
	}
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
func (s *Service) readonlyAvailable(pool string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	reason := "no runner of pool " + pool + " is connected"
	for _, r := range s.runners {
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
