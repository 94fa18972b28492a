package runner

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/sbx-dev/sbx/proto"
	"github.com/sbx-dev/sbx/sandbox"
)

// activitySource is a started job whose processes /proc shows (a *sandbox.Process).
type activitySource interface {
	Activity() (sandbox.Activity, error)
}

// watchActivity looks at the job's processes every ScanInterval and publishes an activity event
// whenever what it sees changes: that they began or stopped waiting for input (with when they
// began), or the ports they listen on. The coordinator turns those into the job's ports, the port
// notifications and the stall notification of a job that waits for input. It returns a function
// that stops it and waits for it, called before the job's end is reported so that nothing about
// the job follows its end.
func (r *Runner) watchActivity(ctx context.Context, j *job, w *proto.Work, p process, log *slog.Logger) func() {
	src, ok := p.(activitySource)
	// A readonly job without input has nothing to show: no network of anyone's, no input to wait on.
	if !ok || r.cfg.ScanInterval < 0 || (w.Readonly && !w.Stdin && !w.TTY) {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(r.cfg.ScanInterval)
		defer t.Stop()
		// The coordinator starts from "not waiting, no ports": only a change is news.
		var (
			seq   int64
			since *time.Time
			ports []proto.Port
		)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			a, err := src.Activity()
			if err != nil {
				log.Warn("look at the job's processes", "err", err)
				continue
			}
			now := time.Now()
			newSince := since
			switch {
			case a.WaitingForInput && since == nil:
				newSince = &now
			case !a.WaitingForInput:
				newSince = nil
			}
			newPorts := make([]proto.Port, 0, len(a.Listening))
			for _, ap := range a.Listening {
				newPorts = append(newPorts, proto.Port{Address: ap.Addr().String(), Port: int(ap.Port())})
			}
			if len(newPorts) > proto.MaxPorts {
				newPorts = newPorts[:proto.MaxPorts]
			}
			changed := (newSince == nil) != (since == nil) || !slices.Equal(newPorts, ports)
			since, ports = newSince, newPorts
			if !changed {
				continue
			}
			seq++
			e := &proto.Event{Kind: proto.EventActivity, JobID: j.id, Claim: j.claim, Seq: seq, InputSince: since, Ports: ports}
			if err := r.publishEvent(ctx, e); err != nil && ctx.Err() == nil {
				log.Warn("report the job's activity", "err", err)
			}
		}
	}()
	return func() { cancel(); wg.Wait() }
}
