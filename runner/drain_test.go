package runner

import (
	"context"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/proto"
	"github.com/sbx-dev/sbx/sandbox"
)

// TestDrain: once its context ends, a runner with a drain timeout takes no more work, says draining
// in its heartbeats, lets a job that ends in time finish, kills the one that does not when the
// timeout passes, and returns nil.
func TestDrain(t *testing.T) {
	h := newHarness(t)
	beats := h.heartbeats("drain")
	r, err := New(h.nc, Config{ID: "drain", Cgroup: sandbox.Config{Root: testCgroupRoot("sbx-runner-test")}, DrainTimeout: 3 * time.Second, HeartbeatInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	short := h.submit("sleep 1; echo finished", proto.Limits{})
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

	if e := h.exited(short, 10*time.Second); e.Reason != proto.ReasonExit || h.out(short) != "finished\n" {
		t.Fatalf("the job that ended within the drain: %+v, output %q", e, h.out(short))
	}
	e := h.exited(long, 10*time.Second)
	took := time.Since(stopped)
	if e.Reason != proto.ReasonKilled || took < 3*time.Second {
		t.Fatalf("the job that outlived the drain: %+v after %s, want killed after the 3 s drain", e, took)
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
