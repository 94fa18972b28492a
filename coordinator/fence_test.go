package coordinator_test

import (
	"slices"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
)

// beat is a heartbeat of runner r1 listing the jobs it runs.
func beat(boot time.Time, jobs ...string) *coordinator.Heartbeat {
	hb := heartbeat(boot)
	hb.Slots, hb.Running, hb.Jobs = 8, len(jobs), jobs
	return hb
}

// waitKills waits until the dispatcher saw n kill requests and returns them.
func waitKills(t *testing.T, e *env, n int) []string {
	t.Helper()
	if !poll.Within(5*time.Second, func() bool { return len(e.disp.Kills()) >= n }) {
		t.Fatalf("kills %v, want %d", e.disp.Kills(), n)
	}
	time.Sleep(20 * time.Millisecond) // a window in which no more kills may come
	return e.disp.Kills()
}

// TestLostJobFenced: a job marked lost because its runner fell silent is killed when the runner is
// heard from again still running it, and its late events do not revive it; a job the runner no
// longer lists, or one being taken, is left alone; a restarted coordinator fences as well.
func TestLostJobFenced(t *testing.T) {
	dir := t.TempDir()
	clk := &clock{now: time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)}
	e := openEnv(t, dir, clk, testConfig(clk))
	boot := clk.Now()
	e.svc.HandleHeartbeat(beat(boot))
	id := e.start(coordinator.StartRequest{Command: "sleep 100"})
	e.svc.HandleHeartbeat(beat(boot, id))
	if k := waitKills(t, e, 0); len(k) != 0 {
		t.Fatalf("kills %v for a job running where the coordinator has it", k)
	}
	clk.advance(16 * time.Second) // past the runner deadline
	w, err := e.svc.Wait(t.Context(), id, 5*time.Second, nil)
	if err != nil || w.Job.Reason != proto.ReasonLost {
		t.Fatalf("job %+v, %v; want lost", w, err)
	}

	// The runner comes back: its output and exit are dropped, and it is told to kill the job.
	e.chunk(id, 0, "late\n")
	code := 0
	ev := event(proto.EventExited, id, clk.Now())
	ev.ExitCode, ev.Reason = &code, proto.ReasonExit
	e.event(ev)
	e.svc.HandleHeartbeat(beat(boot, id))
	if k := waitKills(t, e, 1); !slices.Equal(k, []string{id}) {
		t.Fatalf("kills %v, want one of %s", k, id)
	}
	j, err := e.svc.Job(t.Context(), id)
	if err != nil || j.Status != coordinator.StatusAborted || j.Reason != proto.ReasonLost || j.OutputBytes != 0 {
		t.Fatalf("after the late events: %+v, %v; want still aborted, lost, without the late output", j, err)
	}
	// Killed: the runner lists it no more, and a job it is taking is left alone.
	res, err := e.svc.Start(t.Context(), coordinator.StartRequest{Command: "true", Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	e.svc.HandleHeartbeat(beat(boot, res.Job.ID))
	if k := waitKills(t, e, 1); len(k) != 1 {
		t.Fatalf("kills %v, want still one", k)
	}

	// A coordinator that restarted has no memory of the fence, and needs none.
	e.stop()
	e = openEnv(t, dir, clk, testConfig(clk))
	e.svc.HandleHeartbeat(beat(boot, id, res.Job.ID))
	if k := waitKills(t, e, 1); !slices.Equal(k, []string{id}) {
		t.Fatalf("kills after the restart %v, want one of %s", k, id)
	}
}
