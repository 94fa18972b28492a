package coordinator

import (
	"context"
	"time"

	"github.com/sbx-dev/sbx/proto"
)

// fenceLocked has a runner kill the jobs its heartbeat lists that the coordinator does not consider
// running there: marked lost while the runner was stalled or cut off, ended otherwise, unknown, or
// taken by another runner. Their events meanwhile find them ended and are dropped. Together with the
// runner killing its own jobs when it cannot reach NATS, a job is never both lost and running for
// longer than a heartbeat: the coordinator needs no memory of what it marked lost, and a coordinator
// that restarted fences as well. A job listed but still queued here is being taken: it is left
// alone. The kill requests go in the background, one at a time per job; the next heartbeat that
// still lists a job sends another. s.mu is held.
func (s *Service) fenceLocked(runner string, jobs []string) {
	for _, id := range jobs {
		if l, ok := s.live[id]; ok && (l.job.Runner == "" || l.job.Runner == runner) {
			continue
		}
		if s.fencing[id] {
			continue
		}
		s.fencing[id] = true
		s.strays.Add(1)
		go func() {
			defer s.strays.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			reply, err := s.disp.Control(ctx, runner, &proto.Control{V: proto.Version, Op: proto.OpKill, JobID: id})
			s.mu.Lock()
			delete(s.fencing, id)
			s.mu.Unlock()
			switch {
			case err != nil:
				s.cfg.Logger.Warn("kill a job its runner should not run", "job", id, "runner", runner, "err", err)
			case reply.Code == proto.ReplyOK:
				s.cfg.Logger.Warn("killed a job its runner ran although it had ended here", "job", id, "runner", runner)
			}
		}()
	}
}
