package main

import (
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/client"
)

// TestStateOutlivesTheDataDir: the coordinator's state is in JetStream, so a coordinator started on
// the same NATS with a new, empty data dir (the first one's disk lost) shows the same job, its
// output and the same notification, with its seq, and the session's next notification takes the next seq.
func TestStateOutlivesTheDataDir(t *testing.T) {
	n := newRestartableNATS(t, true)
	first, c := startFleetCoordinator(t, n.url())
	startFleetRunner(t, n.url(), "keeper")
	waitRunner(t, c, "keeper")
	dir := jobDir(t)
	notes := func(c *client.Client, want int) []client.Notification {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			after := uint64(0)
			r, err := c.Notifications(t.Context(), "keep", &after, time.Second)
			if err == nil && len(r.Notifications) >= want {
				return r.Notifications
			}
			if time.Now().After(deadline) {
				t.Fatalf("session keep: %+v, %v; want %d notifications", r, err, want)
			}
		}
	}
	start, err := c.Start(t.Context(), client.StartRequest{Command: "echo kept", Cwd: dir, Session: "keep"})
	if err != nil {
		t.Fatal(err)
	}
	job := waitStatus(t, c, start.Job.ID, 30*time.Second, ended)
	before := notes(c, 1)
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}

	_, c = startFleetCoordinator(t, n.url())
	got, err := c.Job(t.Context(), job.ID)
	if err != nil || got.Status != job.Status || got.CreatedAt != job.CreatedAt {
		t.Fatalf("the job through a coordinator with a new data dir: %+v, %v; want %+v", got, err, job)
	}
	// Its output too: not in the new data dir, it is read from SBX_OUTPUT.
	if out, total, err := c.Output(t.Context(), job.ID, 0, -1); err != nil || total != 5 || string(out) != "kept\n" {
		t.Fatalf("the job's output through a coordinator with a new data dir: %q (total %d), %v", out, total, err)
	}
	after := notes(c, 1)
	if len(after) != 1 || after[0].ID != before[0].ID || after[0].Seq != before[0].Seq {
		t.Fatalf("notifications through a coordinator with a new data dir: %+v; want %+v", after, before)
	}
	waitRunner(t, c, "keeper")
	next, err := c.Start(t.Context(), client.StartRequest{Command: "true", Cwd: dir, Session: "keep"})
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, next.Job.ID, 30*time.Second, ended)
	if all := notes(c, 2); all[1].JobID != next.Job.ID || all[1].Seq != before[0].Seq+1 {
		t.Fatalf("notifications after the next job: %+v; want its seq to follow %d", all, before[0].Seq)
	}
}
