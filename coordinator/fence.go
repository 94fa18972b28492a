package coordinator

// fence has a runner kill the jobs its heartbeat lists that the coordinator does not consider
// running there: marked lost while the runner was stalled or cut off, ended otherwise, unknown, or
// taken by another runner. Their events meanwhile find them ended and are dropped. Together with the
// runner killing its own jobs when it cannot reach NATS, a job is never both lost and running for
// longer than a heartbeat: the coordinator needs no memory of what it marked lost, and a coordinator
// that restarted fences as well. A job listed but still queued here is being taken: it is left
// alone. The kill requests go through the fleet's stopStray: one in flight per job; the next
// heartbeat that still lists a job sends another.
//
// The jobs are looked at under lc.mu and the requests asked for under it (jobs, then fleet: the
// lock order of service.go), so that a job does not end or move between the look and the request.
func (lc *lifecycle) fence(runner string, jobs []string) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	for _, id := range jobs {
		if l, ok := lc.live[id]; ok && (l.job.Runner == "" || l.job.Runner == runner) {
			continue
		}
		lc.fleet.stopStray(runner, id)
	}
}
