package coordinator

import "context"

// endNotified reports whether the job's last notification was already sent before its end: a
// monitor stopped for printing too much says so once, and its end adds nothing (the tools send one
// terminal notice).
func (l *liveJob) endNotified() bool {
	return l.watch != nil && l.watch.monStopped
}

// checkNotes closes the debounce windows whose time has come and checks for stalls (stall.go).
func (lc *lifecycle) checkNotes(ctx context.Context) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	now := lc.cfg.Now()
	for _, l := range lc.live {
		if l.quiet {
			continue
		}
		if l.watch != nil {
			l.watch.tick(now)
			if err := lc.sessions.deliver(ctx, l.job, l.watch.take()); err != nil {
				lc.cfg.Logger.Error("store output notification", "job", l.job.ID, "err", err)
			}
		}
		lc.checkStallLocked(ctx, l, now)
	}
}
