package coordinator

import (
	"context"
	"time"

	"github.com/sbx-dev/sbx/proto"
)

// fenceTTL is how long the coordinator keeps asking a runner to kill a job it marked lost. A runner
// cut off for longer has killed the job itself (its FenceAfter is the runner deadline).
const fenceTTL = 10 * time.Minute

// fencedJob is a job marked lost whose runner may still run it: the runner stalled or was cut off
// rather than died. Until the runner confirms the job is gone (its kill reply), every heartbeat of
// the runner brings a kill request; events it sends for the job meanwhile find the job ended and are
// dropped. So a job is never both lost and running for long: the runner kills it itself past its
// deadline, and the coordinator kills it as soon as the runner is heard from again.
type fencedJob struct {
	runner   string
	until    time.Time
	inFlight bool
}

// fenceLocked records a job just marked lost. s.mu is held.
func (s *Service) fenceLocked(runner, id string, now time.Time) {
	s.fenced[id] = &fencedJob{runner: runner, until: now.Add(fenceTTL)}
}

// expireFencesLocked forgets fences past their TTL. s.mu is held.
func (s *Service) expireFencesLocked(now time.Time) {
	for id, f := range s.fenced {
		if now.After(f.until) {
			delete(s.fenced, id)
		}
	}
}

// killFencedLocked asks a runner that was just heard from to kill the jobs marked lost on it, in
// the background; a fence is dropped once the runner answers (killed, or it has no such job). s.mu
// is held.
func (s *Service) killFencedLocked(runner string) {
	for id, f := range s.fenced {
		if f.runner != runner || f.inFlight {
			continue
		}
		f.inFlight = true
		s.strays.Add(1)
		go func() {
			defer s.strays.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			reply, err := s.disp.Control(ctx, runner, &proto.Control{V: proto.Version, Op: proto.OpKill, JobID: id})
			s.mu.Lock()
			defer s.mu.Unlock()
			f.inFlight = false
			if err != nil {
				s.cfg.Logger.Warn("kill a job marked lost", "job", id, "runner", runner, "err", err)
				return
			}
			if reply.Code == proto.ReplyOK {
				s.cfg.Logger.Warn("killed a job marked lost that its runner still ran", "job", id, "runner", runner)
			}
			delete(s.fenced, id)
		}()
	}
}
