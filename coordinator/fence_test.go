package coordinator_test

import (
	"slices"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/proto"
)

// TestLostJobFenced: a job marked lost because its runner fell silent is killed when the runner is
// heard from again, its late events do not revive it, and once the runner answered the kill no
// other is sent.
func TestLostJobFenced(t *testing.T) {
	e := newEnv(t)
	boot := e.clk.Now()
	e.svc.HandleHeartbeat(heartbeat(boot, e.clk.Now()))
	id := e.start(coordinator.StartRequest{Command: "sleep 100"})
	e.clk.advance(16 * time.Second) // past the runner deadline
	w, err := e.svc.Wait(t.Context(), id, 5*time.Second, nil)
	if err != nil || w.Job.Reason != proto.ReasonLost {
		t.Fatalf("job %+v, %v; want lost", w, err)
	}
	if k := e.disp.kills(); len(k) != 0 {
		t.Fatalf("kills %v before the runner came back", k)
	}

	// The runner comes back: its output and exit are dropped, and it is told to kill the job.
	e.chunk(id, 0, "late\n")
	code := 0
	ev := event(proto.EventExited, id, e.clk.Now())
	ev.ExitCode, ev.Reason = &code, proto.ReasonExit
	e.event(ev)
	e.svc.HandleHeartbeat(heartbeat(boot, e.clk.Now()))
	for deadline := time.Now().Add(5 * time.Second); !slices.Contains(e.disp.kills(), id); {
		if time.Now().After(deadline) {
			t.Fatalf("no kill sent for the lost job; controls %v", e.disp.kills())
		}
		time.Sleep(5 * time.Millisecond)
	}
	j, err := e.svc.Job(t.Context(), id)
	if err != nil || j.Status != coordinator.StatusAborted || j.Reason != proto.ReasonLost || j.OutputBytes != 0 {
		t.Fatalf("after the late events: %+v, %v; want still aborted, lost, without the late output", j, err)
	}
	time.Sleep(50 * time.Millisecond) // the kill's reply settled the fence
	e.svc.HandleHeartbeat(heartbeat(boot, e.clk.Now()))
	time.Sleep(50 * time.Millisecond)
	if k := e.disp.kills(); len(k) != 1 {
		t.Fatalf("kills %v, want exactly one", k)
	}
}
