package store

import (
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
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

// TestTerminalFile writes a job's life into its terminal file and compares it with the API.md format.
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
