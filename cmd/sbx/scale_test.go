package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/internal/poll"
)

// buildSbx builds the sbx binary for a test, or returns $SBX_TEST_BINARY, one built beforehand (the
// cgroup v2 guest of .ci/cgroup2-guest has no go tool).
func buildSbx(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("SBX_TEST_BINARY"); bin != "" {
		return bin
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go tool to build sbx, or SBX_TEST_BINARY")
	}
	bin := filepath.Join(t.TempDir(), "sbx")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go build: %v", err)
	}
	return bin
}

// startProcess runs the sbx binary until the test ends and returns its pid and its stdout's first
// lines. At the end it is stopped with SIGINT, and killed when it has not exited within stopWithin.
func startProcess(t testing.TB, stopWithin time.Duration, bin string, args ...string) (int, <-chan string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go scanLines(stdout, func(l string) {
		select {
		case lines <- l:
		default:
		}
	})
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(stopWithin):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return cmd.Process.Pid, lines
}

// TestScaleOut: a coordinator and two runners as separate processes on one NATS: work spreads over
// both, a runner never runs more jobs than its slots, and jobs queue while every slot is busy.
func TestScaleOut(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runners need root for cgroups")
	}
	ns := natstest.Server(t)
	bin := buildSbx(t)
	url := ns.ClientURL()
	_, lines := startProcess(t, 20*time.Second, bin, "coordinator", "--nats", url, "--listen", "127.0.0.1:0", "--data", t.TempDir())
	var addr string
	select {
	case line := <-lines:
		_, rest, _ := strings.Cut(line, "API ")
		addr, _, _ = strings.Cut(rest, ",")
	case <-time.After(30 * time.Second):
		t.Fatal("coordinator did not start")
	}
	for _, id := range []string{"scale-a", "scale-b"} {
		startProcess(t, 20*time.Second, bin, "runner", "--nats", url, "--id", id, "--slots", "2", "--cgroup-root", testCgroupRoot("sbx-scale-test"))
	}
	c := client.New(addr, "")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var (
		rs  []client.Runner
		err error
	)
	if !poll.Within(2*time.Minute, func() bool {
		rs, err = c.Runners(ctx)
		return err == nil && len(rs) == 2
	}) {
		t.Fatalf("runners did not join: %v %v", rs, err)
	}

	var ids []string
	for range 20 {
		r, err := c.Start(ctx, client.StartRequest{Command: "sleep 0.3", Cwd: "/"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.Job.ID)
	}
	perRunner := map[string][]span{}
	var firstEnd, lastStart time.Time
	for _, id := range ids {
		w, err := c.Wait(ctx, id, time.Minute, "")
		if err != nil || !w.Done || w.Job.Status != "succeeded" {
			t.Fatalf("job %s: %+v, %v", id, w, err)
		}
		j := w.Job
		perRunner[j.Runner] = append(perRunner[j.Runner], span{*j.StartedAt, *j.EndedAt})
		if firstEnd.IsZero() || j.EndedAt.Before(firstEnd) {
			firstEnd = *j.EndedAt
		}
		if j.StartedAt.After(lastStart) {
			lastStart = *j.StartedAt
		}
	}
	if len(perRunner) != 2 {
		t.Fatalf("jobs ran on %d runners, want both: %v", len(perRunner), perRunner)
	}
	for r, spans := range perRunner {
		if peak := peakOverlap(spans); peak > 2 {
			t.Errorf("runner %s ran %d jobs at once with 2 slots", r, peak)
		}
	}
	if !lastStart.After(firstEnd) {
		t.Errorf("no job waited for a free slot: last start %s, first end %s", lastStart, firstEnd)
	}
}

// span is when a job ran.
type span struct{ start, end time.Time }

// peakOverlap is the largest number of spans open at one instant.
func peakOverlap(spans []span) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, s := range spans {
		edges = append(edges, edge{s.start, 1}, edge{s.end, -1})
	}
	sort.Slice(edges, func(i, k int) bool {
		if edges[i].at.Equal(edges[k].at) {
			return edges[i].delta < edges[k].delta
		}
		return edges[i].at.Before(edges[k].at)
	})
	open, peak := 0, 0
	for _, e := range edges {
		open += e.delta
		peak = max(peak, open)
	}
	return peak
}

// scanLines calls f with each line read from r.
func scanLines(r io.Reader, f func(string)) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f(sc.Text())
	}
}
