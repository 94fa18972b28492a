package coordinator

import (
	"context"
	"time"
)

// Retention defaults: what the coordinator keeps of ended jobs unless configured otherwise.
const (
	DefaultRetainAge   = 7 * 24 * time.Hour
	DefaultRetainBytes = 10 << 30
)

// maxRemovePerPass bounds the work of one retention pass; the next pass goes on.
const maxRemovePerPass = 1000

// storedOutput sums the output of the ended jobs in the store, once at start-up; the Service keeps
// the sum up to date afterwards.
func storedOutput(ctx context.Context, jobs Store) (int64, error) {
	var total int64
	err := jobs.OldestJobs(ctx, func(j *Job) bool {
		if j.Status.Ended() {
			total += j.OutputBytes
		}
		return true
	})
	return total, err
}

// retain removes what is past the retention settings: ended jobs (record and terminal file) that
// ended more than RetainAge ago, then the oldest ended jobs while their output adds up to more than
// RetainBytes, and notifications older than RetainAge. Running jobs are never removed. It runs every
// RetentionInterval.
func (s *Service) retain(ctx context.Context) {
	now := s.cfg.Now()
	cutoff := now.Add(-s.cfg.RetainAge)
	s.mu.Lock()
	total := s.outputTotal
	s.mu.Unlock()
	var doomed []*Job
	err := s.jobs.OldestJobs(ctx, func(j *Job) bool {
		over := total > s.cfg.RetainBytes
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
		s.cfg.Logger.Error("retention: list jobs", "err", err)
		return
	}
	if len(doomed) > 0 {
		ids := make([]string, len(doomed))
		for i, j := range doomed {
			ids[i] = j.ID
		}
		// The record goes first: a job whose file is gone but whose record stays would answer with
		// an output it no longer has.
		if err := s.jobs.DeleteJobs(ctx, ids); err != nil {
			s.cfg.Logger.Error("retention: remove jobs", "err", err)
			return
		}
		var freed int64
		for _, j := range doomed {
			freed += j.OutputBytes
			if err := s.out.Remove(j.ID); err != nil {
				s.cfg.Logger.Warn("retention: remove output", "job", j.ID, "err", err)
			}
		}
		s.mu.Lock()
		s.outputTotal -= freed
		s.stats.JobsRemoved += int64(len(doomed))
		s.mu.Unlock()
		s.cfg.Logger.Info("retention: removed ended jobs", "jobs", len(doomed), "bytes", freed)
	}
	n, err := s.jobs.DeleteNotificationsBefore(ctx, cutoff)
	if err != nil {
		s.cfg.Logger.Error("retention: remove notifications", "err", err)
	}
	if n > 0 {
		s.mu.Lock()
		s.stats.NotificationsRemoved += int64(n)
		s.mu.Unlock()
	}
}
