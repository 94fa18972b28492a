package runner

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/proto"
	"github.com/sbx-dev/sbx/sandbox"
)

// TestDrain: once its context ends, a runner with a drain timeout takes no more work, says draining
// in its heartbeats, lets a job that ends in time finish, kills the one that does not when the
// timeout passes, and returns nil. The job that ends in time ends as soon as the drain has begun, and the
// drain is long enough for its end to be reported on a slow machine (an emulated guest).
func TestDrain(t *testing.T) {
	h := newHarness(t)
	beats := h.heartbeats("drain")
	const drain = 8 * time.Second
	r, err := New(h.nc, Config{ID: "drain", Cgroup: sandbox.Config{Root: testCgroupRoot("sbx-runner-test")}, DrainTimeout: drain, HeartbeatInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	// The gate is where any job user can see it (t.TempDir is 0700).
	gateDir, err := os.MkdirTemp("", "sbx-drain")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(gateDir) })
	if err := os.Chmod(gateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	gate := filepath.Join(gateDir, "drained")
	short := h.submit("while [ ! -e "+gate+" ]; do sleep 0.05; done; echo finished", proto.Limits{})
	long := h.submit("echo started; sleep 1000", proto.Limits{})
	h.started(short, 10*time.Second)
	h.started(long, 10*time.Second)

	stopped := time.Now()
	cancel()
	for draining := false; !draining; {
		select {
		case hb := <-beats:
			draining = hb.Draining
		case <-time.After(5 * time.Second):
			t.Fatal("no heartbeat says draining")
		}
	}
	late := h.submit("echo should not run", proto.Limits{})
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	if e := h.exited(short, 10*time.Second); e.Reason != proto.ReasonExit || h.out(short) != "finished\n" {
		t.Fatalf("the job that ended within the drain: %+v, output %q", e, h.out(short))
	}
	e := h.exited(long, 10*time.Second)
	took := time.Since(stopped)
	if e.Reason != proto.ReasonKilled || took < drain {
		t.Fatalf("the job that outlived the drain: %+v after %s, want killed after the %s drain", e, took, drain)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the drain")
	}
	h.mu.Lock()
	n := len(h.events[late])
	h.mu.Unlock()
	if n != 0 {
		t.Fatalf("work queued during the drain was taken (%d events)", n)
	}
}

// started waits for the job's started event.
func (h *harness) started(id string, timeout time.Duration) {
	h.t.Helper()
	deadline := time.After(timeout)
	for {
		h.mu.Lock()
		for _, e := range h.events[id] {
			if e.Kind == proto.EventStarted {
				h.mu.Unlock()
				return
			}
		}
		ch := h.change
		h.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			h.t.Fatalf("job %s did not start within %s", id, timeout)
		}
	}
}
