package coordinator

import (
	"context"
	"sync"
	"time"
)

// Retention defaults: what the coordinator keeps of ended jobs unless configured otherwise.
const (
	DefaultRetainAge   = 7 * 24 * time.Hour
	DefaultRetainBytes = 10 << 30
)

// Disk bounds by default (Config.OutputBudget, Config.MinFreeBytes).
const (
	DefaultOutputBudget = 20 << 30
	DefaultMinFreeBytes = 1 << 30
)

// freeSpacer is implemented by an OutputStore that can tell the free space of its disk.
type freeSpacer interface {
	FreeBytes() (int64, error)
}

// maxRemovePerPass bounds the work of one retention pass; the next pass goes on.
const maxRemovePerPass = 1000

// retention is the part of the coordinator that owns the disk's budget and what is kept of ended
// jobs: the output of the ended jobs in the store (stored, for RetainBytes) and of the jobs not
// ended (live), together held to OutputBudget (room, grew), and the retention pass (retain) that
// removes what is past RetainAge and RetainBytes.
//
// It calls no other part and holds its mutex only over its own counters, never across a store
// call: it is last in the lock order (service.go), so the jobs' part counts output and ends under
// its own lock.
type retention struct {
	cfg   *Config
	store Store
	out   OutputStore

	mu     sync.Mutex
	stored int64
	live   int64
	// jobsRemoved and notesRemoved count what retain removed, for Stats.
	jobsRemoved  int64
	notesRemoved int64
}

// newRetention sums the output of the ended jobs in the store, once at start-up; the jobs' part
// counts that of the jobs not ended as it loads them (grew). The counters are kept up to date
// afterwards.
func newRetention(ctx context.Context, cfg *Config, store Store, out OutputStore) (*retention, error) {
	r := &retention{cfg: cfg, store: store, out: out}
	err := store.OldestJobs(ctx, func(j *Job) bool {
		if j.Status.Ended() {
			r.stored += j.OutputBytes
		}
		return true
	})
	return r, err
}

// room returns why a new job may not start for lack of disk, or nil (Service.RoomForJob).
func (r *retention) room() error {
	r.mu.Lock()
	used := r.stored + r.live
	r.mu.Unlock()
	if used >= r.cfg.OutputBudget {
		return Errorf(EOUTPUTBUDGET, "The output stored for all jobs (%d bytes) reached the coordinator's budget of %d bytes (--output-budget): no job starts until running jobs end or retention removes ended ones (--retain-bytes, --retain-age).", used, r.cfg.OutputBudget)
	}
	fs, ok := r.out.(freeSpacer)
	if !ok || r.cfg.MinFreeBytes < 0 {
		return nil
	}
	free, err := fs.FreeBytes()
	if err != nil {
		return err
	}
	if free < r.cfg.MinFreeBytes {
		return Errorf(EDISKLOW, "The coordinator's data disk has %d bytes free, less than the %d it keeps (--min-free-disk): no job starts until space is freed.", free, r.cfg.MinFreeBytes)
	}
	return nil
}

// grew counts n more bytes of a live job's output and reports whether the output of all jobs is
// now past OutputBudget.
func (r *retention) grew(n int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.live += n
	return r.stored+r.live > r.cfg.OutputBudget
}

// ended moves a job's output from the live jobs' (live bytes counted) to the ended jobs' (stored
// bytes, its record's OutputBytes).
func (r *retention) ended(live, stored int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.live -= live
	r.stored += stored
}

// counts returns the output stored and live, and what retain removed.
func (r *retention) counts() (stored, live, jobsRemoved, notesRemoved int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stored, r.live, r.jobsRemoved, r.notesRemoved
}

// retain removes what is past the retention settings: ended jobs (record and terminal file) that
// ended more than RetainAge ago, then the oldest ended jobs while their output adds up to more than
// RetainBytes, and notifications older than RetainAge. Running jobs are never removed: only an
// ended job's record is looked at, and a job's record is ended only once the jobs' part let it
// go. It runs every RetentionInterval.
func (r *retention) retain(ctx context.Context) {
	now := r.cfg.Now()
	cutoff := now.Add(-r.cfg.RetainAge)
	r.mu.Lock()
	total := r.stored
	r.mu.Unlock()
	var doomed []*Job
	err := r.store.OldestJobs(ctx, func(j *Job) bool {
		over := total > r.cfg.RetainBytes
		// A job created after the cutoff cannot have ended before it.
		if !over && j.CreatedAt.After(cutoff) {
			return false
		}
		if j.Status.Ended() && (over || j.EndedAt.Before(cutoff)) {
			doomed = append(doomed, j)
			total -= j.OutputBytes
		}
		return len(doomed) < maxRemovePerPass
	})
	if err != nil {
		r.cfg.Logger.Error("retention: list jobs", "err", err)
		return
	}
	if len(doomed) > 0 {
		ids := make([]string, len(doomed))
		for i, j := range doomed {
			ids[i] = j.ID
		}
		// The record goes first: a job whose file is gone but whose record stays would answer with
		// an output it no longer has.
		if err := r.store.DeleteJobs(ctx, ids); err != nil {
			r.cfg.Logger.Error("retention: remove jobs", "err", err)
			return
		}
		var freed int64
		for _, j := range doomed {
			freed += j.OutputBytes
			if err := r.out.Remove(j.ID); err != nil {
				r.cfg.Logger.Warn("retention: remove output", "job", j.ID, "err", err)
			}
		}
		r.mu.Lock()
		r.stored -= freed
		r.jobsRemoved += int64(len(doomed))
		r.mu.Unlock()
		r.cfg.Logger.Info("retention: removed ended jobs", "jobs", len(doomed), "bytes", freed)
	}
	n, err := r.store.DeleteNotificationsBefore(ctx, cutoff)
	if err != nil {
		r.cfg.Logger.Error("retention: remove notifications", "err", err)
	}
	if n > 0 {
		r.mu.Lock()
		r.notesRemoved += int64(n)
		r.mu.Unlock()
	}
}
