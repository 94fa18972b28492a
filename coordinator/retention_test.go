package coordinator_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/coordinatortest"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
)

// retentionService is a Service with the retention settings given, applied every 5 ms.
func retentionService(t *testing.T, clk *clock, age time.Duration, bytes int64) *coordinator.Service {
	t.Helper()
	return newServiceWith(t, coordinator.Config{
		Now: clk.Now, RetainAge: age, RetainBytes: bytes, RetentionInterval: 5 * time.Millisecond,
	})
}

// runJob starts a job and has it print out and exit 0 at the clock's time; it returns its id.
func runJob(t *testing.T, svc *coordinator.Service, clk *clock, out string) string {
	t.Helper()
	ctx := t.Context()
	res, err := svc.Start(ctx, coordinator.StartRequest{Command: "echo", Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Job.ID
	if err := svc.HandleEvent(ctx, coordinatortest.Claimed(svc, event(proto.EventStarted, id, clk.Now()))); err != nil {
		t.Fatal(err)
	}
	if out != "" {
		if err := svc.HandleChunk(ctx, coordinatortest.ClaimedChunk(svc, &coordinator.Chunk{JobID: id, Offset: 0, Data: []byte(out)})); err != nil {
			t.Fatal(err)
		}
	}
	code := 0
	exit := &coordinator.Event{Kind: proto.EventExited, JobID: id, Runner: "r1", Time: clk.Now(), ExitCode: &code, Reason: proto.ReasonExit, OutputBytes: int64(len(out))}
	if err := svc.HandleEvent(ctx, coordinatortest.Claimed(svc, exit)); err != nil {
		t.Fatal(err)
	}
	return id
}

// gone waits until the job is removed: its record answers not found and its terminal file is gone.
func waitGone(t *testing.T, svc *coordinator.Service, id string) {
	t.Helper()
	var err error
	if !poll.Within(5*time.Second, func() bool {
		_, err = svc.Job(t.Context(), id)
		return coordinator.ErrorCode(err) == coordinator.ENOTFOUND
	}) {
		t.Fatalf("job %s still there: %v", id, err)
	}
}

func present(t *testing.T, svc *coordinator.Service, id string) bool {
	t.Helper()
	j, err := svc.Job(t.Context(), id)
	if err != nil {
		return false
	}
	_, ferr := os.Stat(j.OutputPath)
	return ferr == nil
}

// TestRetentionAge: jobs that ended more than RetainAge ago go (record and terminal file), and so do
// older notifications; a job still running and a recent one stay.
func TestRetentionAge(t *testing.T) {
	clk := &clock{now: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)}
	svc := retentionService(t, clk, 24*time.Hour, 1<<30)
	old := runJob(t, svc, clk, "old\n")
	oldPath := filepath.Join(filepath.Dir(mustJob(t, svc, old).OutputPath), old+".txt")
	res, err := svc.Start(t.Context(), coordinator.StartRequest{Command: "sleep", Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	running := res.Job.ID
	if err := svc.HandleEvent(t.Context(), coordinatortest.Claimed(svc, event(proto.EventStarted, running, clk.Now()))); err != nil {
		t.Fatal(err)
	}
	var zero uint64
	before, _, err := svc.Notifications(t.Context(), coordinator.NotificationQuery{Session: "default", After: &zero})
	if err != nil || len(before) != 1 {
		t.Fatalf("notifications %+v, %v; want the old job's finished one", before, err)
	}

	clk.advance(25 * time.Hour)
	recent := runJob(t, svc, clk, "recent\n")
	waitGone(t, svc, old)
	// The record goes first, the terminal file after it: wait for the file too.
	poll.Until(t, 5*time.Second, "terminal file of a removed job gone", func() bool {
		_, err := os.Stat(oldPath)
		return errors.Is(err, os.ErrNotExist)
	})
	if !present(t, svc, recent) || !present(t, svc, running) {
		t.Error("a recent or running job was removed")
	}
	// The pass removes the records first and the notifications after: wait for the pass to end.
	var after []*coordinator.Notification
	poll.Within(5*time.Second, func() bool {
		after, _, err = svc.Notifications(t.Context(), coordinator.NotificationQuery{Session: "default", After: &zero})
		return err != nil || len(after) <= 1 && svc.Stats().NotificationsRemoved > 0
	})
	if err != nil || len(after) != 1 || after[0].JobID != recent {
		t.Fatalf("notifications after retention: %+v, %v; want only the recent job's", after, err)
	}
	if st := svc.Stats(); st.JobsRemoved != 1 || st.NotificationsRemoved != 1 || st.OutputStored != int64(len("recent\n")) {
		t.Errorf("stats %+v", st)
	}
}

// TestRetentionBytes: past RetainBytes the oldest ended jobs go first, until what is kept fits.
func TestRetentionBytes(t *testing.T) {
	clk := &clock{now: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)}
	svc := retentionService(t, clk, 24*time.Hour, 10)
	a := runJob(t, svc, clk, "aaaaaa")
	clk.advance(time.Millisecond)
	b := runJob(t, svc, clk, "bbbbbb")
	clk.advance(time.Millisecond)
	c := runJob(t, svc, clk, "cccc")
	waitGone(t, svc, a)
	if !present(t, svc, b) || !present(t, svc, c) {
		t.Errorf("b and c (10 bytes together) should stay")
	}
	// The count drops once the pass has removed the files, just after the records: wait for it.
	if !poll.Within(5*time.Second, func() bool { return svc.Stats().OutputStored == 10 }) {
		t.Fatalf("output stored %d, want 10", svc.Stats().OutputStored)
	}
}

func mustJob(t *testing.T, svc *coordinator.Service, id string) *coordinator.Job {
	t.Helper()
	j, err := svc.Job(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return j
}
