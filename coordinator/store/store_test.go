package store

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func at(s string) *time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return &t
}

func sampleJob() *coordinator.Job {
	return &coordinator.Job{
		ID: "0mx26g2ocl8z6", Session: "default", Title: "unit tests", Command: "npm test\necho \"done\"", Cwd: "/home/dev/app",
		Pool: "default", Status: coordinator.StatusRunning, Pid: 4242, CreatedAt: *at("2026-11-29T17:59:59.900Z"),
		StartedAt: at("2026-11-29T18:00:00Z"),
	}
}

// TestTerminalFile writes a job's life into its terminal file and compares it with the docs/api.md format.
func TestTerminalFile(t *testing.T) {
	terms, err := OpenTerminals(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer terms.Close()
	j := sampleJob()
	if err := terms.Begin(j); err != nil {
		t.Fatal(err)
	}
	// Out of order, as redelivered chunks may come.
	if err := terms.Write(j.ID, 7, []byte("line 2\nno newline")); err != nil {
		t.Fatal(err)
	}
	if err := terms.Write(j.ID, 0, []byte("line 1\n")); err != nil {
		t.Fatal(err)
	}
	if err := terms.Touch(j, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	golden(t, terms.Path(j.ID), "running.txt")

	code := 1
	j.Status, j.ExitCode, j.EndedAt, j.OutputBytes = coordinator.StatusFailed, &code, at("2026-11-29T18:00:08.123Z"), 24
	if err := terms.End(j); err != nil {
		t.Fatal(err)
	}
	golden(t, terms.Path(j.ID), "ended.txt")

	rc, err := terms.Open(j.ID, 2, 10)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if b, _ := io.ReadAll(rc); string(b) != "ne 1\nline " {
		t.Fatalf("Open(2, 10) = %q", b)
	}
}

func golden(t *testing.T, path, name string) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(want, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	w, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(w) {
		t.Fatalf("%s differs from %s:\n%s\nwant:\n%s", path, want, got, w)
	}
}

// TestTerminalReopen: after a restart the header length is read back from the file, so output still
// lands after it, and Size counts the body only.
func TestTerminalReopen(t *testing.T) {
	dir := t.TempDir()
	terms, _ := OpenTerminals(dir)
	j := sampleJob()
	if err := terms.Begin(j); err != nil {
		t.Fatal(err)
	}
	terms.Write(j.ID, 0, []byte("before\n"))
	terms.Close()

	terms, _ = OpenTerminals(dir)
	defer terms.Close()
	if n, err := terms.Size(j.ID); err != nil || n != 7 {
		t.Fatalf("Size = %d, %v; want 7", n, err)
	}
	if err := terms.Write(j.ID, 7, []byte("after\n")); err != nil {
		t.Fatal(err)
	}
	rc, _ := terms.Open(j.ID, 0, -1)
	defer rc.Close()
	if b, _ := io.ReadAll(rc); string(b) != "before\nafter\n" {
		t.Fatalf("body %q", b)
	}
	if n, _ := terms.Size("nosuchjob"); n != 0 {
		t.Fatalf("Size of a job without a file = %d", n)
	}
}

func TestDB(t *testing.T) {
	ctx := context.Background()
	db, err := Open(filepath.Join(t.TempDir(), "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ids := []string{"0000000001aaaa", "0000000002aaaa", "0000000003aaaa"}
	for i, id := range ids {
		j := &coordinator.Job{ID: id, Session: []string{"a", "b", "a"}[i], Status: coordinator.StatusQueued}
		if err := db.PutJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	ended := &coordinator.Job{ID: ids[1], Session: "b", Status: coordinator.StatusSucceeded}
	if err := db.PutJob(ctx, ended); err != nil {
		t.Fatal(err)
	}
	jobs, err := db.Jobs(ctx, coordinator.JobFilter{Session: "a"})
	if err != nil || len(jobs) != 2 || jobs[0].ID != ids[2] || jobs[1].ID != ids[0] {
		t.Fatalf("Jobs(session a) = %v, %v; want newest first", jobs, err)
	}
	jobs, _ = db.Jobs(ctx, coordinator.JobFilter{Status: coordinator.StatusSucceeded})
	if len(jobs) != 1 || jobs[0].ID != ids[1] {
		t.Fatalf("Jobs(succeeded) = %v", jobs)
	}
	jobs, _ = db.Jobs(ctx, coordinator.JobFilter{Limit: 1})
	if len(jobs) != 1 || jobs[0].ID != ids[2] {
		t.Fatalf("Jobs(limit 1) = %v", jobs)
	}
	unfinished, _ := db.UnfinishedJobs(ctx)
	if len(unfinished) != 2 {
		t.Fatalf("UnfinishedJobs = %d jobs, want 2", len(unfinished))
	}
	if _, err := db.Job(ctx, "nope"); coordinator.ErrorCode(err) != coordinator.ENOTFOUND {
		t.Fatalf("Job(nope) = %v", err)
	}
}

// TestModes: output and the store are private to the coordinator's user, in a new install and in
// one an older sbx made with open modes.
func TestModes(t *testing.T) {
	mode := func(path string) os.FileMode {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	for _, old := range []bool{false, true} {
		dir := t.TempDir()
		terms, db := filepath.Join(dir, "terminals"), filepath.Join(dir, "sbx.db")
		oldFile := filepath.Join(terms, "0mx26g2ocl8z5.txt")
		if old {
			if err := os.Mkdir(terms, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{oldFile, db} {
				if err := os.WriteFile(f, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(f, 0o644); err != nil { // past the umask
					t.Fatal(err)
				}
			}
			if err := os.Chmod(terms, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		d, err := Open(db)
		if err != nil {
			t.Fatal(err)
		}
		d.Close()
		ts, err := OpenTerminals(terms)
		if err != nil {
			t.Fatal(err)
		}
		j := sampleJob()
		if err := ts.Begin(j); err != nil {
			t.Fatal(err)
		}
		ts.Close()
		want := map[string]os.FileMode{db: 0o600, terms: 0o700, ts.Path(j.ID): 0o600}
		if old {
			want[oldFile] = 0o600
		}
		for path, m := range want {
			if got := mode(path); got != m {
				t.Errorf("old install %v: %s has mode %04o, want %04o", old, path, got, m)
			}
		}
	}
}

func openDB(t *testing.T) *DB {
	t.Helper()
	db, err := Open(filepath.Join(t.TempDir(), "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func note(id, session string) *coordinator.Notification {
	return &coordinator.Notification{ID: id, Session: session, Kind: coordinator.KindFinished, CreatedAt: time.Now()}
}

// TestAddNotificationsWith: write sees the new notifications with their seqs, not one already
// stored; when it fails nothing is kept, and the next call takes the same seqs.
func TestAddNotificationsWith(t *testing.T) {
	ctx := context.Background()
	db := openDB(t)
	if err := db.AddNotifications(ctx, []*coordinator.Notification{note("n1", "s")}); err != nil {
		t.Fatal(err)
	}
	failed := errors.New("jetstream down")
	var seen []uint64
	err := db.AddNotificationsWith(ctx, []*coordinator.Notification{note("n1", "s"), note("n2", "s"), note("n3", "s")}, func(added []*coordinator.Notification) error {
		for _, n := range added {
			seen = append(seen, n.Seq)
		}
		return failed
	})
	if !errors.Is(err, failed) || !slices.Equal(seen, []uint64{2, 3}) {
		t.Fatalf("AddNotificationsWith = %v, write saw seqs %v; want the write's error and seqs [2 3]", err, seen)
	}
	if notes, _ := db.Notifications(ctx, "s", 0, 0); len(notes) != 1 {
		t.Fatalf("after a failed write, %d notifications stored, want 1", len(notes))
	}
	if sessions, _ := db.Sessions(ctx); len(sessions) != 1 || sessions[0].LastSeq != 1 {
		t.Fatalf("after a failed write, sessions %+v; want s at last seq 1", sessions)
	}
	n2 := note("n2", "s")
	if err := db.AddNotificationsWith(ctx, []*coordinator.Notification{n2}, func([]*coordinator.Notification) error { return nil }); err != nil || n2.Seq != 2 {
		t.Fatalf("AddNotificationsWith again = %v, seq %d; want seq 2", err, n2.Seq)
	}
}

// TestResetAndLoad: Reset forgets everything; PutJobs, PutSession, PutNotifications and RaiseLastSeq
// load it back as a Sync does, seqs as given, and the next notification follows the last seq.
func TestResetAndLoad(t *testing.T) {
	ctx := context.Background()
	db := openDB(t)
	if err := db.PutJob(ctx, sampleJob()); err != nil {
		t.Fatal(err)
	}
	if err := db.PutSession(ctx, &coordinator.Session{ID: "s", Acked: 1}); err != nil {
		t.Fatal(err)
	}
	if err := db.AddNotifications(ctx, []*coordinator.Notification{note("n1", "s")}); err != nil {
		t.Fatal(err)
	}
	if err := db.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	jobs, _ := db.Jobs(ctx, coordinator.JobFilter{})
	unfinished, _ := db.UnfinishedJobs(ctx)
	sessions, _ := db.Sessions(ctx)
	notes, _ := db.Notifications(ctx, "s", 0, 0)
	if len(jobs)+len(unfinished)+len(sessions)+len(notes) != 0 {
		t.Fatalf("after Reset: %d jobs, %d unfinished, %d sessions, %d notifications", len(jobs), len(unfinished), len(sessions), len(notes))
	}

	ended := sampleJob()
	ended.ID, ended.Status = "0mx26g2ocl8z7", coordinator.StatusSucceeded
	if err := db.PutJobs(ctx, []*coordinator.Job{sampleJob(), ended}); err != nil {
		t.Fatal(err)
	}
	if unfinished, _ := db.UnfinishedJobs(ctx); len(unfinished) != 1 || unfinished[0].ID != sampleJob().ID {
		t.Fatalf("UnfinishedJobs after PutJobs = %v", unfinished)
	}
	if err := db.PutSession(ctx, &coordinator.Session{ID: "s", Acked: 1}); err != nil {
		t.Fatal(err)
	}
	// Seq 5 was the last one given; 3 and 4 expired.
	if err := db.RaiseLastSeq(ctx, "s", 5); err != nil {
		t.Fatal(err)
	}
	n2 := note("n2", "s")
	n2.Seq = 2
	if err := db.PutNotifications(ctx, []*coordinator.Notification{n2}); err != nil {
		t.Fatal(err)
	}
	if err := db.RaiseLastSeq(ctx, "s", 4); err != nil {
		t.Fatal(err)
	}
	if sessions, _ := db.Sessions(ctx); len(sessions) != 1 || sessions[0].LastSeq != 5 || sessions[0].Acked != 1 {
		t.Fatalf("sessions %+v; want s at last seq 5, acked 1", sessions)
	}
	// A notification loaded above the last seq raises it.
	n7 := note("n7", "t")
	n7.Seq = 7
	if err := db.PutNotifications(ctx, []*coordinator.Notification{n7}); err != nil {
		t.Fatal(err)
	}
	again, n6 := note("n2", "s"), note("n6", "s")
	next := note("n8", "t")
	if err := db.AddNotifications(ctx, []*coordinator.Notification{again, n6, next}); err != nil {
		t.Fatal(err)
	}
	if again.Seq != 2 || n6.Seq != 6 || next.Seq != 8 {
		t.Fatalf("seqs after the load: n2 %d (want 2, stored already), n6 %d (want 6), n8 %d (want 8)", again.Seq, n6.Seq, next.Seq)
	}
}
