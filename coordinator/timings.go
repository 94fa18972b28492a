package coordinator

import "time"

// Timings are when a job passed each stage of its way, in µs since this coordinator accepted its
// start (Job.Timings; 0: not passed, or not known). The coordinator's own stages are read on its
// monotonic clock; the runner's (taken, cgroup, exec, exit) are offsets on the runner's clock
// (Stages), placed on the coordinator's by the event that took least time to arrive: the
// runner took the work at the earliest of receipt − sent_us over its events, so what an event
// spends on its way is counted before taken, never inside the runner's steps. A stage is never
// shown before the one it follows: when the estimate puts it earlier (a runner can take the work
// before the stream's acknowledgement reaches the coordinator), it is shown equal to it.
//
// Only the coordinator that accepted a start knows its origin: the stages of a job it took over
// from an earlier life of the coordinator stay as they were stored.
type Timings struct {
	// StoredUS: the job was written to the store.
	StoredUS int64 `json:"stored_us,omitempty"`
	// PublishedUS: the work stream acknowledged the job's work.
	PublishedUS int64 `json:"published_us,omitempty"`
	// TakenUS: a runner took the work.
	TakenUS int64 `json:"taken_us,omitempty"`
	// CgroupUS: the job's cgroup was ready.
	CgroupUS int64 `json:"cgroup_us,omitempty"`
	// ExecUS: the job's process was about to execute its program.
	ExecUS int64 `json:"exec_us,omitempty"`
	// FirstOutputUS: the coordinator wrote the job's first output bytes. A job that exits right
	// after its first write shows its exit no earlier than this.
	FirstOutputUS int64 `json:"first_output_us,omitempty"`
	// ExitUS: the job's program exited.
	ExitUS int64 `json:"exit_us,omitempty"`
	// ExitStoredUS: the coordinator stored the job's end (its notifications and output's footer
	// first).
	ExitStoredUS int64 `json:"exit_stored_us,omitempty"`
}

// clock is what a live job's coordinator measured of it, from which its Timings are made.
type clock struct {
	// accepted is when this coordinator accepted the start (with its monotonic reading); zero for
	// a job loaded from the store.
	accepted                                   time.Time
	stored, published, firstOutput, exitStored int64
	// taken is the runner's taking of the work on this clock (the least receipt − sent_us so far);
	// runner are the runner's latest stages, relative to taken.
	taken  int64
	runner Stages
}

// since is the µs from accepted to now (at least 1: 0 means not passed), or 0 when the job was not
// accepted here.
func (c *clock) since(now time.Time) int64 {
	if c.accepted.IsZero() {
		return 0
	}
	return max(now.Sub(c.accepted).Microseconds(), 1)
}

// event takes a runner's stages, received at now.
func (c *clock) event(st *Stages, now time.Time) {
	at := c.since(now)
	if st == nil || at == 0 {
		return
	}
	if taken := at - st.SentUS; c.taken == 0 || taken < c.taken {
		c.taken = max(taken, 1)
	}
	for _, f := range []struct {
		dst *int64
		v   int64
	}{
		{&c.runner.CgroupUS, st.CgroupUS}, {&c.runner.ExecUS, st.ExecUS}, {&c.runner.ExitUS, st.ExitUS},
	} {
		if f.v > 0 {
			*f.dst = f.v
		}
	}
}

// timings places every stage known so far, in order.
func (c *clock) timings() Timings {
	var t Timings
	prev := int64(0)
	place := func(dst *int64, v int64) {
		if v == 0 {
			return
		}
		*dst = max(v, prev)
		prev = *dst
	}
	runner := func(v int64) int64 {
		if v == 0 || c.taken == 0 {
			return 0
		}
		return c.taken + v
	}
	place(&t.StoredUS, c.stored)
	place(&t.PublishedUS, c.published)
	place(&t.TakenUS, c.taken)
	place(&t.CgroupUS, runner(c.runner.CgroupUS))
	place(&t.ExecUS, runner(c.runner.ExecUS))
	place(&t.FirstOutputUS, c.firstOutput)
	place(&t.ExitUS, runner(c.runner.ExitUS))
	place(&t.ExitStoredUS, c.exitStored)
	return t
}

// retimeLocked updates the job's Timings from its clock; lc.mu (lifecycle) is held. A job loaded from the store
// keeps what was stored.
func (l *liveJob) retimeLocked() {
	if !l.clock.accepted.IsZero() {
		l.job.Timings = l.clock.timings()
	}
}
