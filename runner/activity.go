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

// fullScanTicks is how many ScanIntervals a job without input goes at most without a look at its
// processes while the runner's listening sockets do not change (listenGate): a job listening in a
// network namespace of its own (unshare -n) changes nothing the runner's digest covers.
const fullScanTicks = 30

// listenGate is the runner's ListenDigest, read at most once per ScanInterval for all its jobs, and
// a generation that changes with it. Looking at each job's processes every second cost a thousand
// sleeping jobs 40 % of a CPU (BenchmarkSleepingJobs); a job without input can change what it shows
// only by starting or stopping to listen, which the digest sees.
type listenGate struct {
	mu     sync.Mutex
	at     time.Time
	digest uint64
	gen    uint64
}

// generation returns the gate's generation, reading the digest again when it is older than maxAge.
// A digest that cannot be read counts as a change.
func (g *listenGate) generation(maxAge time.Duration) uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.at.IsZero() && time.Since(g.at) < maxAge {
		return g.gen
	}
	d, err := sandbox.ListenDigest()
	g.at = time.Now()
	if err != nil || d != g.digest {
		g.digest = d
		g.gen++
	}
	return g.gen
}

// watchActivity looks at the job's processes every ScanInterval and publishes an activity event
// whenever what it sees changes: that they began or stopped waiting for input (with when they
// began), or the ports they listen on. A job without input is looked at only when the runner's
// listening sockets changed since the last look (listenGate), and every fullScanTicks anyway. The
// coordinator turns those into the job's ports, the port notifications and the stall notification
// of a job that waits for input. It returns a function that stops it and waits for it, called
// before the job's end is reported so that nothing about the job follows its end.
func (r *Runner) watchActivity(ctx context.Context, j *job, w *proto.Work, p process, log *slog.Logger) func() {
	src, ok := p.(activitySource)
	// A readonly job without input has nothing to show: no network of anyone's, no input to wait on.
	if !ok || r.cfg.ScanInterval < 0 || (w.Readonly && !w.Stdin && !w.TTY) {
		return func() {}
	}
	hasInput := w.Stdin || w.TTY
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
			// looked: the generation of the runner's listening sockets at the last look, and the
			// ticks since; a first look is due.
			looked  uint64
			skipped = fullScanTicks
		)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			// Read before the look, so that a socket that begins listening during it changes the
			// generation the next tick compares with.
			gen := r.listen.generation(r.cfg.ScanInterval / 2)
			if !hasInput && gen == looked && skipped < fullScanTicks {
				skipped++
				continue
			}
			looked, skipped = gen, 0
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
