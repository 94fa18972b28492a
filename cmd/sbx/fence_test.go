package main

import (
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
	"github.com/sbx-dev/sbx/runner"
)

// startRunnerProcess runs `sbx runner` as a process of its own, which a test can stop or kill, with
// the default runner deadline, and waits until the coordinator of c lists it.
func startRunnerProcess(t *testing.T, c *client.Client, natsURL, id string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a runner runs jobs in cgroups: needs root")
	}
	cmd := exec.Command(buildSbx(t), "runner", "--nats", natsURL, "--id", id, "--cgroup-root", testCgroupRoot("sbx-fleet-test"))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	waitRunner(t, c, id)
	return cmd
}

// fencedWithin waits for the job to be reported ended, and fails the test unless it is lost and its
// process pid died no later than that, within limit of since.
func fencedWithin(t *testing.T, coord *part, c *client.Client, id string, pid int, since time.Time, limit time.Duration) {
	t.Helper()
	var (
		died  time.Time
		alive bool
		j     *client.Job
		err   error
	)
	if !poll.Within(time.Until(since.Add(limit+5*time.Second)), func() bool {
		alive = processAlive(pid)
		if !alive && died.IsZero() {
			died = time.Now()
		}
		j, err = c.Job(t.Context(), id)
		return err == nil && ended(j)
	}) {
		t.Fatalf("job %s not ended %s after the runner's fault: %+v, %v (its process alive: %v); the coordinator's log:\n%s", id, time.Since(since), j, err, alive, coord.logText())
	}
	if alive {
		t.Fatalf("job %s %s after %s while its process still ran", j.Status, j.Reason, time.Since(since).Round(10*time.Millisecond))
	}
	t.Logf("job %s %s %s after the runner's fault; its process died %s after it",
		j.Status, j.Reason, time.Since(since).Round(10*time.Millisecond), died.Sub(since).Round(10*time.Millisecond))
	if j.Status != "aborted" || j.Reason != "lost" {
		t.Fatalf("job %+v, want aborted, lost", j)
	}
	if took := time.Since(since); took > limit {
		t.Fatalf("lost after %s, want within %s; the coordinator's log:\n%s", took, limit, coord.logText())
	}
}

// TestFrozenRunnerFenced: the jobs of a runner stopped by SIGSTOP, which cannot fence them itself,
// are dead by the time the coordinator declares them lost: its fence process kills them.
func TestFrozenRunnerFenced(t *testing.T) {
	n := newRestartableNATS(t, true)
	coord, c := startFleetCoordinator(t, n.url())
	r := startRunnerProcess(t, c, n.url(), "frozen")
	id, pid := startSpinner(t, c)

	if err := r.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	fencedWithin(t, coord, c, id, pid, time.Now(), proto.DefaultRunnerDeadline+2*time.Second)
}

// TestKilledRunnerFenced: at the default settings, a runner killed by kill -9 has its jobs reported
// lost within 10 s, and they are dead (its fence kills them at once; so does the init's parent-death
// signal).
func TestKilledRunnerFenced(t *testing.T) {
	n := newRestartableNATS(t, true)
	coord, c := startFleetCoordinator(t, n.url())
	r := startRunnerProcess(t, c, n.url(), "killed")
	id, pid := startSpinner(t, c)

	if err := r.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	took := poll.Until(t, 5*time.Second, "the job of a runner killed by kill -9 dies", func() bool { return !processAlive(pid) })
	t.Logf("the job died %s after its runner", took.Round(10*time.Millisecond))
	fencedWithin(t, coord, c, id, pid, killed, 10*time.Second)
}

// TestRunnerDeadlineFlag: the coordinator refuses a --runner-deadline that runners refuse, naming the
// flag, before anything connects; so do runners.
func TestRunnerDeadlineFlag(t *testing.T) {
	for _, cmd := range [][]string{
		{"coordinator", "--nats", "nats://127.0.0.1:1", "--listen", "127.0.0.1:0", "--data", t.TempDir()},
		{"runner", "--nats", "nats://127.0.0.1:1"},
	} {
		for _, d := range []string{"0s", "-1s", "99ms"} {
			err := run(t.Context(), append(cmd, "--runner-deadline", d), os.Getenv, io.Discard, io.Discard)
			if code(err) != 2 || !strings.Contains(err.Error(), "--runner-deadline") {
				t.Errorf("%s --runner-deadline %s: %v (exit %d), want a usage error naming --runner-deadline", cmd[0], d, err, code(err))
			}
		}
	}
}

// TestSlotsFlag: --slots out of range is a usage error naming the flag, before serve or a runner
// starts anything (serve used to print its banner and then stop its runner).
func TestSlotsFlag(t *testing.T) {
	for _, cmd := range [][]string{
		{"serve", "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:-1", "--data", t.TempDir()},
		{"runner", "--nats", "nats://127.0.0.1:1"},
	} {
		for _, n := range []string{"0", "-1", strconv.Itoa(runner.MaxSlots + 1)} {
			var out strings.Builder
			err := run(t.Context(), append(cmd, "--slots", n), os.Getenv, &out, io.Discard)
			if code(err) != 2 || !strings.Contains(err.Error(), "--slots") || out.Len() > 0 {
				t.Errorf("%s --slots %s: %v (exit %d, printed %q), want a usage error naming --slots and nothing started", cmd[0], n, err, code(err), out.String())
			}
		}
	}
}
