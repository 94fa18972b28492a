package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/proto"
)

// composeRunnerDeadline is the coordinator's RunnerDeadline (coordinator.Config's default): how long a
// runner may be silent before its jobs are lost.
const composeRunnerDeadline = proto.DefaultRunnerDeadline

// fleet is a docker compose project of this checkout's docker-compose.yml: NATS, a coordinator, three
// runners in pool default and one in pool gpu, each runner with 2 slots.
type fleet struct {
	t       *testing.T
	compose []string // the compose command: docker compose, or docker-compose
	env     []string
	project string
	image   string // the sbx image of this checkout
	addr    string // the coordinator's published address, as of the last client()
}

// composeCLI returns the compose command that works here (the docker plugin first), or nil.
func composeCLI() []string {
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}
	}
	if exec.Command("docker-compose", "version").Run() == nil {
		return []string{"docker-compose"}
	}
	return nil
}

// startFleet builds the images (deploy/images.sh: base images only when absent; the sbx image of this
// checkout every time, under a tag of its own so that other checkouts' tests do not replace it) and
// brings up docker-compose.yml as a project with a unique name, torn down with its volumes when the
// test ends.
func startFleet(t *testing.T) *fleet {
	t.Helper()
	return startFleetFrom(t, "docker-compose.yml", "--profile", "gpu", "up", "-d", "--no-build", "--scale", "runner=3")
}

// startFleetFrom is startFleet with another compose file of the checkout and up command.
func startFleetFrom(t *testing.T, file string, up ...string) *fleet {
	t.Helper()
	if testing.Short() {
		t.Skip("the docker fleet takes minutes: not with -short")
	}
	if out, err := exec.Command("docker", "info", "--format", "{{.ServerVersion}}").CombinedOutput(); err != nil {
		t.Skipf("needs a Docker engine (docker info: %v: %s)", err, bytes.TrimSpace(out))
	}
	cli := composeCLI()
	if cli == nil {
		t.Skip("needs docker compose or docker-compose")
	}
	if os.Geteuid() != 0 {
		t.Skip("deploy/images.sh runs debootstrap: needs root")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(root))
	image := "sbx:test-" + hex.EncodeToString(sum[:4])
	f := &fleet{t: t, compose: cli, project: "sbxtest" + rand.Text()[:8], image: image}
	f.project = strings.ToLower(f.project)
	f.env = append(os.Environ(), "SBX_IMAGE="+image, "SBX_PUBLISH=127.0.0.1:", "SBX_PUBLISH_1=127.0.0.1:", "SBX_PUBLISH_2=127.0.0.1:",
		"SBX_SLOTS=2", "COMPOSE_PROJECT_NAME="+f.project, "COMPOSE_FILE="+filepath.Join(root, file))

	start := time.Now()
	build := exec.Command(filepath.Join(root, "deploy/images.sh"))
	build.Env = f.env
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("deploy/images.sh: %v\n%s", err, out)
	}
	t.Logf("images ready in %s", time.Since(start).Round(time.Second))

	t.Cleanup(func() {
		if t.Failed() {
			out, _ := f.run("logs", "--no-color", "--tail", "200")
			t.Logf("compose logs:\n%s", out)
		}
		if out, err := f.run("--profile", "gpu", "down", "-v", "--remove-orphans", "--timeout", "5"); err != nil {
			t.Errorf("compose down: %v\n%s", err, out)
		}
	})
	f.must(up...)
	t.Logf("fleet %s up in %s", f.project, time.Since(start).Round(time.Second))
	return f
}

// run runs a compose command of the project and returns its combined output.
func (f *fleet) run(args ...string) (string, error) {
	cmd := exec.Command(f.compose[0], append(f.compose[1:], args...)...)
	cmd.Env = f.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// must runs a compose command and fails the test when it fails.
func (f *fleet) must(args ...string) string {
	f.t.Helper()
	out, err := f.run(args...)
	if err != nil {
		f.t.Fatalf("compose %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// docker runs a docker command and fails the test when it fails.
func (f *fleet) docker(args ...string) string {
	f.t.Helper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	if err != nil {
		f.t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// container returns the container id of a service's first (or only) container.
func (f *fleet) container(service string) string {
	f.t.Helper()
	ids := strings.Fields(f.must("ps", "-q", service))
	if len(ids) == 0 {
		f.t.Fatalf("no container for %s", service)
	}
	return ids[0]
}

// runnerContainer returns the container of a runner: a runner's id is its host name, which docker
// sets to the container's short id.
func (f *fleet) runnerContainer(runner string) string {
	f.t.Helper()
	return f.docker("inspect", "--format", "{{.Id}}", runner)
}

// client returns a client of the coordinator at its published port (which a restart may change) with
// the token the init service generated.
func (f *fleet) client() *client.Client {
	f.t.Helper()
	return f.clientOf("coordinator")
}

// clientOf is client for the coordinator of service.
func (f *fleet) clientOf(service string) *client.Client {
	f.t.Helper()
	port := strings.TrimSpace(f.must("port", service, "7070"))
	token := strings.TrimSpace(f.must("exec", "-T", service, "cat", "/run/sbx/token"))
	if port == "" || token == "" {
		f.t.Fatalf("coordinator port %q, token %q", port, token)
	}
	f.addr = "http://" + port
	return client.New(f.addr, token)
}

// runners waits until the coordinator hears from n runners and returns them by pool.
func (f *fleet) runners(ctx context.Context, c *client.Client, n int) map[string][]client.Runner {
	f.t.Helper()
	var last []client.Runner
	var err error
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		last, err = c.Runners(ctx)
		if err == nil && len(last) == n {
			byPool := map[string][]client.Runner{}
			for _, r := range last {
				byPool[r.Pool] = append(byPool[r.Pool], r)
			}
			return byPool
		}
	}
	f.t.Fatalf("want %d runners, have %d: %+v (%v)", n, len(last), last, err)
	return nil
}

// startLog returns the start log every fault workload appends its tag to, read from the shared
// workspace volume by a container of its own: any runner may be down when it is read.
func (f *fleet) startLog() string {
	f.t.Helper()
	return f.docker("run", "--rm", "-v", f.project+"_workspace:/workspace", "--entrypoint", "cat", f.image,
		"/workspace/starts.log")
}

// workload is a checkable job: it appends its tag to the start log (a second start shows), sleeps,
// then writes `seq 1 n`.
func workload(tag string, sleep time.Duration, n int) string {
	return fmt.Sprintf("echo %s >> /workspace/starts.log; sleep %g; seq 1 %d", tag, sleep.Seconds(), n)
}

// seqOutput is what `seq 1 n` writes.
func seqOutput(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%d\n", i)
	}
	return b.String()
}

// startJobs starts one workload job per tag in session and returns their ids in order.
func startJobs(t *testing.T, ctx context.Context, c *client.Client, session string, tags []string, sleep time.Duration, n int) []string {
	t.Helper()
	var ids []string
	for _, tag := range tags {
		r, err := c.Start(ctx, client.StartRequest{Command: workload(tag, sleep, n), Cwd: "/workspace", Session: session, Title: tag})
		if err != nil {
			t.Fatalf("start %s: %v", tag, err)
		}
		ids = append(ids, r.Job.ID)
	}
	return ids
}

// startAfterOutage starts one workload job, retrying while the coordinator answers unavailable (NATS
// is not back yet): a refused start never runs, so retrying it is safe, and it is what a client does.
func startAfterOutage(t *testing.T, ctx context.Context, c *client.Client, session, tag string) string {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		r, err := c.Start(ctx, client.StartRequest{Command: workload(tag, 0, 10), Cwd: "/workspace", Session: session, Title: tag})
		var ce *client.Error
		switch {
		case err == nil:
			return r.Job.ID
		case !errors.As(err, &ce) || ce.Code != "unavailable" || time.Now().After(deadline):
			t.Fatalf("start %s: %v", tag, err)
		}
	}
}

// pollJob polls a job until cond holds or the deadline passes.
func pollJob(t *testing.T, ctx context.Context, c *client.Client, id string, within time.Duration, cond func(*client.Job) bool) *client.Job {
	t.Helper()
	var j *client.Job
	var err error
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if j, err = c.Job(ctx, id); err == nil && cond(j) {
			return j
		}
	}
	t.Fatalf("job %s after %s: %+v (%v)", id, within, j, err)
	return nil
}

func jobRunning(j *client.Job) bool { return j.Status == "running" }
func jobEnded(j *client.Job) bool   { return j.Ended() }

// finishedOnce checks that session has exactly one finished notification for each of ids, and none
// for any other job.
func finishedOnce(t *testing.T, ctx context.Context, c *client.Client, session string, ids []string) {
	t.Helper()
	after := uint64(0)
	n, err := c.Notifications(ctx, session, &after, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, x := range n.Notifications {
		if x.Kind == "finished" {
			count[x.JobID]++
		}
	}
	for _, id := range ids {
		if count[id] != 1 {
			t.Errorf("job %s: %d finished notifications, want 1", id, count[id])
		}
		delete(count, id)
	}
	if len(count) > 0 {
		t.Errorf("finished notifications for other jobs: %v", count)
	}
}

// startedOnce checks that each tag is in the start log exactly once: no job ran twice.
func startedOnce(t *testing.T, log string, tags []string) {
	t.Helper()
	seen := map[string]int{}
	for _, l := range strings.Fields(log) {
		seen[l]++
	}
	for _, tag := range tags {
		if seen[tag] != 1 {
			t.Errorf("%s started %d times, want once", tag, seen[tag])
		}
	}
}

// checkOutput checks that a job succeeded and wrote exactly `seq 1 n`.
func checkOutput(t *testing.T, ctx context.Context, c *client.Client, id string, n int) {
	t.Helper()
	j, err := c.Job(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if j.Status != "succeeded" {
		t.Errorf("job %s: %s (%s) %s, want succeeded", id, j.Status, j.Reason, j.Error)
		return
	}
	out, _, err := c.Output(ctx, id, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	if want := seqOutput(n); string(out) != want {
		t.Errorf("job %s: %d bytes of output, want %d (seq 1 %d)", id, len(out), len(want), n)
	}
}

// tags names n jobs of a case.
func tags(prefix string, n int) []string {
	var s []string
	for i := range n {
		s = append(s, fmt.Sprintf("%s-%d", prefix, i))
	}
	return s
}

// TestComposeFleet brings up docker-compose.yml (NATS, a coordinator, 3 runners in pool default and 1
// in pool gpu, 2 slots each) and checks, against the published port as a user would: jobs spread
// over the runners by capacity, pool placement, readonly on every runner, and four faults with a
// checkable workload: a runner container killed, NATS restarted, the coordinator killed and
// restarted, a runner cut off the network for longer than the runner deadline.
func TestComposeFleet(t *testing.T) {
	f := startFleet(t)
	ctx := t.Context()
	c := f.client()
	byPool := f.runners(ctx, c, 4)
	if len(byPool["default"]) != 3 || len(byPool["gpu"]) != 1 {
		t.Fatalf("runners by pool: %+v", byPool)
	}

	t.Run("spread", func(t *testing.T) {
		// 9 jobs of 2 s on 3 runners × 2 slots: every runner runs some, none more than 2 at once.
		var ids []string
		for range 9 {
			r, err := c.Start(ctx, client.StartRequest{Command: "sleep 2; hostname", Cwd: "/workspace", Session: "spread"})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, r.Job.ID)
		}
		per := map[string][]span{}
		for _, id := range ids {
			j := pollJob(t, ctx, c, id, time.Minute, jobEnded)
			if j.Status != "succeeded" {
				t.Fatalf("job %s: %+v", id, j)
			}
			out, _, err := c.Output(ctx, id, 0, -1)
			if err != nil || strings.TrimSpace(string(out)) != j.Runner {
				t.Errorf("job %s ran on %s but printed host name %q (%v)", id, j.Runner, out, err)
			}
			per[j.Runner] = append(per[j.Runner], span{*j.StartedAt, *j.EndedAt})
		}
		for _, r := range byPool["default"] {
			if len(per[r.ID]) == 0 {
				t.Errorf("runner %s ran no job: %v", r.ID, per)
			}
			if peak := peakOverlap(per[r.ID]); peak > 2 {
				t.Errorf("runner %s ran %d jobs at once with 2 slots", r.ID, peak)
			}
		}
		if len(per[byPool["gpu"][0].ID]) > 0 {
			t.Errorf("the gpu runner ran a pool default job")
		}
	})

	t.Run("pool", func(t *testing.T) {
		gpu := byPool["gpu"][0].ID
		for range 3 {
			r, err := c.Start(ctx, client.StartRequest{Command: "hostname", Cwd: "/workspace", Pool: "gpu", Session: "pool"})
			if err != nil {
				t.Fatal(err)
			}
			j := pollJob(t, ctx, c, r.Job.ID, 30*time.Second, jobEnded)
			if j.Status != "succeeded" || j.Runner != gpu || j.Pool != "gpu" {
				t.Errorf("pool gpu job: %s on %s (pool %s), want succeeded on %s", j.Status, j.Runner, j.Pool, gpu)
			}
		}
	})

	t.Run("readonly", func(t *testing.T) {
		rs, err := c.Runners(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if !r.Readonly {
				t.Errorf("runner %s: readonly unavailable: %s", r.ID, r.ReadonlyReason)
			}
		}
		// 6 readonly jobs holding a slot 2 s each fill the 6 slots of pool default: one per slot.
		var ids []string
		for range 6 {
			r, err := c.Start(ctx, client.StartRequest{Command: "sleep 2; cat /etc/hostname; touch /workspace/ro 2>/dev/null && echo wrote",
				Cwd: "/workspace", Readonly: true, Session: "readonly"})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, r.Job.ID)
		}
		on := map[string]bool{}
		for _, id := range ids {
			j := pollJob(t, ctx, c, id, time.Minute, jobEnded)
			out, _, _ := c.Output(ctx, id, 0, -1)
			if j.Status != "failed" || strings.Contains(string(out), "wrote") || strings.TrimSpace(string(out)) != j.Runner {
				t.Errorf("readonly job %s on %s: %s, output %q: want the write refused", id, j.Runner, j.Status, out)
			}
			on[j.Runner] = true
		}
		if len(on) != 3 {
			t.Errorf("readonly jobs ran on %d runners, want 3: %v", len(on), on)
		}
	})

	t.Run("auth", func(t *testing.T) {
		// NATS refuses a client without creds, even inside the compose network.
		out, _ := exec.Command("docker", "run", "--rm", "--network", f.project+"_default", "--entrypoint", "bash", f.image, "-c",
			`exec 3<>/dev/tcp/nats/4222; printf 'CONNECT {"verbose":false}\r\nPING\r\n' >&3; timeout 3 cat <&3`).CombinedOutput()
		if !strings.Contains(string(out), "Authorization Violation") || strings.Contains(string(out), "PONG") {
			t.Errorf("an anonymous NATS client got: %q", out)
		}
		// A job runs as sbx-job, without the runner's CAP_SYS_ADMIN, and cannot read the enroll key that
		// mints any runner's creds.
		r, err := c.Start(ctx, client.StartRequest{Command: "id -un; grep CapEff /proc/self/status; cat /run/sbx-enroll/enroll.key", Cwd: "/workspace",
			Session: "auth", BlockUntil: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if r.Job.Status != "failed" || !strings.HasPrefix(r.Output, "sbx-job\nCapEff:\t0000000000000000\n") || !strings.Contains(r.Output, "Permission denied") {
			t.Errorf("a job reading the enroll key: %s, output %q", r.Job.Status, r.Output)
		}
		// The API refuses a call without the token.
		if _, err := client.New(f.addr, "").Runners(ctx); err == nil {
			t.Error("GET /v1/runners without the token succeeded")
		}
	})

	t.Run("kill-runner", func(t *testing.T) {
		tg := tags("kill", 6)
		ids := startJobs(t, ctx, c, "kill-runner", tg, 20*time.Second, 100)
		var victim string
		for i, id := range ids {
			j := pollJob(t, ctx, c, id, 30*time.Second, jobRunning)
			if i == 0 {
				victim = j.Runner
			}
		}
		container := f.runnerContainer(victim)
		f.docker("kill", container)
		killed := time.Now()
		t.Cleanup(func() { f.docker("start", container) })
		for _, id := range ids {
			j := pollJob(t, ctx, c, id, time.Minute, jobEnded)
			if j.Runner == victim {
				if j.Reason != "lost" || j.EndedAt.Sub(killed) > composeRunnerDeadline+5*time.Second {
					t.Errorf("job %s of the killed runner: %s/%s at +%s, want lost within %s", id, j.Status, j.Reason,
						j.EndedAt.Sub(killed).Round(time.Second), composeRunnerDeadline+5*time.Second)
				}
			} else {
				checkOutput(t, ctx, c, id, 100)
			}
		}
		finishedOnce(t, ctx, c, "kill-runner", ids)
		startedOnce(t, f.startLog(), tg)
	})

	t.Run("restart-nats", func(t *testing.T) {
		tg := tags("nats", 4)
		const n = 20000
		ids := startJobs(t, ctx, c, "restart-nats", tg, 6*time.Second, n)
		for _, id := range ids {
			pollJob(t, ctx, c, id, 30*time.Second, jobRunning)
		}
		restarted := time.Now()
		f.must("restart", "--timeout", "2", "nats")
		for _, id := range ids {
			j := pollJob(t, ctx, c, id, 90*time.Second, jobEnded)
			if j.EndedAt.Before(restarted) {
				t.Errorf("job %s ended at %s, before NATS restarted at %s: the case tests nothing", id, j.EndedAt, restarted)
			}
			checkOutput(t, ctx, c, id, n)
		}
		after := []string{startAfterOutage(t, ctx, c, "restart-nats", "nats-after")}
		pollJob(t, ctx, c, after[0], time.Minute, jobEnded)
		checkOutput(t, ctx, c, after[0], 10)
		finishedOnce(t, ctx, c, "restart-nats", append(ids, after...))
		startedOnce(t, f.startLog(), append(tg, "nats-after"))
	})

	t.Run("refused-start", func(t *testing.T) {
		// A start refused while NATS is down must never run, or a client that retries runs it twice.
		f.must("stop", "--timeout", "2", "nats")
		_, err := c.Start(ctx, client.StartRequest{Command: workload("refused-0", 0, 1), Cwd: "/workspace", Session: "refused-start"})
		time.Sleep(8 * time.Second)
		f.must("start", "nats")
		if err == nil {
			t.Fatalf("a start with NATS down for 8 s was accepted")
		}
		t.Logf("start with NATS down: %v", err)
		// Once NATS is back and a later job has run, a buffered publish of the refused start would have.
		after := []string{startAfterOutage(t, ctx, c, "refused-start", "refused-after")}
		pollJob(t, ctx, c, after[0], time.Minute, jobEnded)
		time.Sleep(2 * time.Second)
		startedOnce(t, f.startLog(), []string{"refused-after"})
		if log := f.startLog(); strings.Contains(log, "refused-0") {
			t.Errorf("the start refused with %v ran after NATS came back", err)
		}
	})

	t.Run("kill-coordinator", func(t *testing.T) {
		tg := tags("coord", 4)
		const n = 5000
		ids := startJobs(t, ctx, c, "kill-coordinator", tg, 4*time.Second, n)
		for _, id := range ids {
			pollJob(t, ctx, c, id, 30*time.Second, jobRunning)
		}
		coord := f.container("coordinator")
		f.docker("kill", coord)
		killed := time.Now()
		time.Sleep(2 * time.Second)
		f.docker("start", coord)
		restarted := time.Now()
		var last time.Duration
		c = f.client() // the published port may have changed
		for _, id := range ids {
			var j *client.Job
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
				var err error
				if j, err = c.Job(ctx, id); err == nil && j.Ended() || time.Now().After(deadline) {
					break
				}
			}
			if j == nil || !j.Ended() {
				t.Fatalf("job %s did not end after the coordinator restarted: %+v", id, j)
			}
			if j.EndedAt.Before(killed) {
				t.Errorf("job %s ended at %s, before the coordinator was killed at %s: the case tests nothing", id, j.EndedAt, killed)
			}
			checkOutput(t, ctx, c, id, n)
			last = max(last, time.Since(restarted))
		}
		t.Logf("every job seen ended %s after the coordinator restarted", last.Round(100*time.Millisecond))
		finishedOnce(t, ctx, c, "kill-coordinator", ids)
		startedOnce(t, f.startLog(), tg)
	})

	t.Run("disconnect-runner", func(t *testing.T) {
		tg := tags("cut", 4)
		// The jobs outlive the whole case (90 s): one still running at the end was not fenced.
		ids := startJobs(t, ctx, c, "disconnect-runner", tg, 90*time.Second, 10)
		var victim string
		for i, id := range ids {
			j := pollJob(t, ctx, c, id, 30*time.Second, jobRunning)
			if i == 0 {
				victim = j.Runner
			}
		}
		container := f.runnerContainer(victim)
		network := f.project + "_default"
		f.docker("network", "disconnect", network, container)
		cut := time.Now()
		reconnected := false
		reconnect := func() {
			if !reconnected {
				reconnected = true
				f.docker("network", "connect", network, container)
			}
		}
		t.Cleanup(reconnect)
		var lost []string
		for _, id := range ids {
			j, err := c.Job(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if j.Runner == victim {
				j = pollJob(t, ctx, c, id, composeRunnerDeadline+10*time.Second, jobEnded)
				if j.Reason != "lost" {
					t.Errorf("job %s of the cut-off runner: %s/%s, want lost", id, j.Status, j.Reason)
				}
				lost = append(lost, tg[indexOf(ids, id)])
			}
		}
		time.Sleep(time.Until(cut.Add(composeRunnerDeadline + 5*time.Second)))
		reconnect()
		f.runners(ctx, c, 4)
		// Fenced: the runner that comes back kills what the coordinator marked lost, within seconds.
		back := time.Now()
		for {
			ps := f.docker("exec", container, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
			var still []string
			for _, tag := range lost {
				if strings.Contains(ps, "echo "+tag+" ") {
					still = append(still, tag)
				}
			}
			if len(still) == 0 {
				t.Logf("the lost jobs were gone %s after the runner was back", time.Since(back).Round(100*time.Millisecond))
				break
			}
			if time.Since(back) > 20*time.Second {
				t.Errorf("jobs %v were marked lost but still run on %s 20 s after it reconnected", still, victim)
				break
			}
			time.Sleep(time.Second)
		}
		for _, id := range ids {
			if j, err := c.Job(ctx, id); err == nil && !j.Ended() {
				if _, err := c.Kill(ctx, id, ""); err != nil {
					t.Errorf("kill %s: %v", id, err)
				}
			}
			pollJob(t, ctx, c, id, time.Minute, jobEnded)
		}
		finishedOnce(t, ctx, c, "disconnect-runner", ids)
		startedOnce(t, f.startLog(), tg)
	})
}

// indexOf returns the index of s in list, or -1.
func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}
