package coordinator

import (
	"context"
	"io"
	"time"
)

// stallReadBytes is how much of the output's end is read to look for a prompt.
const stallReadBytes = 8 << 10

// checkStallLocked notifies a stall of l's job: its processes all waiting for input, as the runner
// sees it (inputStallLocked), or its output unchanged for StallAfter with a last line that looks
// like a prompt. A stall notifies once per job, as Claude Code's does, and never for a monitor,
// whose quiet spells are its normal state. lc.mu is held.
func (lc *lifecycle) checkStallLocked(ctx context.Context, l *liveJob, now time.Time) {
	if l.job.Monitor || l.stallNotified || l.job.Status != StatusRunning {
		return
	}
	if lc.inputStallLocked(ctx, l, now) {
		return
	}
	if l.stallChecked || l.size == 0 || now.Sub(l.lastGrowth) < lc.cfg.StallAfter {
		return
	}
	l.stallChecked = true
	tail, err := lc.tailLocked(l)
	if err != nil {
		lc.cfg.Logger.Warn("read output tail", "job", l.job.ID, "err", err)
		return
	}
	if n, ok := stallNote(l.job, screenText(l.job, tail), now.Sub(l.lastGrowth).Truncate(time.Second)); ok {
		l.stallNotified = true
		if err := lc.sessions.deliver(ctx, l.job, []note{n}); err != nil {
			lc.cfg.Logger.Error("store stall notification", "job", l.job.ID, "err", err)
		}
	}
}

// tailLocked reads the last stallReadBytes of the job's gap-free output. lc.mu is held.
func (lc *lifecycle) tailLocked(l *liveJob) ([]byte, error) {
	off := max(0, l.size-stallReadBytes)
	rc, err := lc.out.Open(l.job.ID, off, l.size-off)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}
