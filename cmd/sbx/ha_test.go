package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/internal/poll"
)

// process is an sbx process started by a test, to be killed with SIGKILL as a crash would, which
// an in-process part cannot show.
type process struct {
	cmd  *exec.Cmd
	url  string // the API's, from its first line
	done chan struct{}
	log  *tailBuffer
}

// startKillable runs `bin ARGS...` and waits for its first line (the API's address); it is
// killed at the end of the test.
func startKillable(t *testing.T, bin string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	p := &process{cmd: cmd, done: make(chan struct{}), log: &tailBuffer{max: 64 << 10}}
	cmd.Stderr = p.log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case first <- sc.Text():
			default:
			}
		}
	}()
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("sbx %s log:\n%s", args[0], p.log)
		}
	})
	select {
	case line := <-first:
		_, rest, _ := strings.Cut(line, "API ")
		p.url, _, _ = strings.Cut(rest, ",")
	case <-p.done:
		t.Fatalf("sbx %s exited: %s\n%s", args[0], cmd.ProcessState, p.log)
	case <-time.After(60 * time.Second):
		t.Fatalf("sbx %s did not start:\n%s", args[0], p.log)
	}
	return p
}

// kill ends the process with SIGKILL and waits for it.
func (p *process) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// leads reports whether the coordinator says it leads (/readyz).
func leads(ctx context.Context, c *client.Client) bool {
	body, err := c.Do(ctx, "GET", "/readyz", nil)
	return err == nil && strings.Contains(string(body), `"leader":true`)
}

// TestSeveralCoordinators: two coordinators on a 3-node NATS cluster serve one state. Jobs started
// through either are seen through both, and a keyed retry through the other is the same job; when
// the leader is killed mid-workload (SIGKILL), the other takes over, and every job ends with every
// byte of its output, one finished notification, and its command started once. Then the NATS server
// leading the work stream goes, and starts succeed again.
func TestSeveralCoordinators(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a NATS cluster and coordinator processes")
	}
	bin := buildSbx(t)
	cluster := natstest.StartCluster(t, 3)
	urls := cluster.URLs()
	coord := func() *process {
		return startKillable(t, bin, "coordinator", "--nats", urls, "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--replicas", "3", "--lease-ttl", "2s")
	}
	a := coord()
	b := coord()
	ca, cb := client.New(a.url, ""), client.New(b.url, "")
	ca.Session, cb.Session = "ha-test", "ha-test"
	startFleetRunner(t, urls, "ha-runner", "--slots", "16")
	waitRunner(t, ca, "ha-runner")
	waitRunner(t, cb, "ha-runner")

	leader, survivor, cs := a, b, cb
	if !leads(t.Context(), ca) {
		leader, survivor, cs = b, a, ca
	}
	if !leads(t.Context(), client.New(leader.url, "")) {
		t.Fatal("neither coordinator leads")
	}

	// Each job writes 1..N, pauses across the kill, writes N+1..2N; it marks its start in a file of
	// its own, so that a second start shows.
	marks := jobDir(t)
	const jobs, n = 8, 3000
	ids := make([]string, jobs)
	for i := range jobs {
		c, other := []*client.Client{ca, cb}[i%2], []*client.Client{cb, ca}[i%2]
		req := client.StartRequest{
			Cwd:            marks,
			Command:        fmt.Sprintf("echo x >> start-%d; seq 1 %d; sleep 6; seq %d %d", i, n, n+1, 2*n),
			IdempotencyKey: client.NewIdempotencyKey(),
		}
		r, err := c.Start(t.Context(), req)
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		ids[i] = r.Job.ID
		// A retry with the key, through the other coordinator, is the same job.
		again, err := other.Start(t.Context(), req)
		if err != nil || again.Job.ID != r.Job.ID {
			t.Fatalf("start %d repeated through the other coordinator: %+v, %v; want job %s", i, again, err, r.Job.ID)
		}
		// Seen through the other coordinator as soon as the start returned.
		if _, err := other.Job(t.Context(), r.Job.ID); err != nil {
			t.Fatalf("job %s started through one coordinator, not seen through the other: %v", r.Job.ID, err)
		}
	}
	for _, id := range ids {
		waitStatus(t, cs, id, 30*time.Second, func(j *client.Job) bool { return j.OutputBytes > 0 })
	}
	killed := time.Now()
	leader.kill()

	// The survivor answers, ready, once the key stayed unchanged for 0.6 of the TTL (1.2 s here): NATS
	// says the killed leader's connection is gone (natsbus.Lease's early takeover), and it knew the
	// runner from the heartbeats it heard as a standby.
	if !poll.Within(20*time.Second, func() bool { return leads(t.Context(), cs) }) {
		t.Fatalf("the survivor does not lead 20 s after the leader was killed:\n%s", survivor.log)
	}
	t.Logf("the survivor leads %s after the leader was killed", time.Since(killed).Round(time.Millisecond))

	var want strings.Builder
	for i := 1; i <= 2*n; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	for i, id := range ids {
		j := waitStatus(t, cs, id, 60*time.Second, ended)
		if j.Status != "succeeded" {
			t.Errorf("job %s: %s (%s)", id, j.Status, j.Reason)
		}
		out, _, err := cs.Output(t.Context(), id, 0, -1)
		if err != nil {
			t.Fatalf("output of %s: %v", id, err)
		}
		if string(out) != want.String() {
			t.Errorf("job %s: %d bytes of output, want %d (first difference at %d)", id, len(out), want.Len(), firstDiff(out, []byte(want.String())))
		}
		mark, err := os.ReadFile(filepath.Join(marks, fmt.Sprintf("start-%d", i)))
		if err != nil || string(mark) != "x\n" {
			t.Errorf("job %s started %d times", id, strings.Count(string(mark), "x"))
		}
	}
	after := uint64(0)
	page, err := cs.Notifications(t.Context(), "ha-test", &after, 0)
	if err != nil {
		t.Fatal(err)
	}
	finished := map[string]int{}
	for _, note := range page.Notifications {
		if note.Kind == "finished" {
			finished[note.JobID]++
		}
	}
	for _, id := range ids {
		if finished[id] != 1 {
			t.Errorf("job %s: %d finished notifications, want 1", id, finished[id])
		}
	}

	// Then the NATS server leading the work stream goes: the stream elects another leader, and
	// starts succeed again within seconds.
	nc, err := nats.Connect(urls)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	work, err := js.Stream(t.Context(), "SBX_WORK")
	if err != nil {
		t.Fatal(err)
	}
	cluster.ShutdownLeader(t, work)
	lost := time.Now()
	for i := range 4 {
		var r *client.StartReply
		for {
			r, err = cs.Start(t.Context(), client.StartRequest{Cwd: marks, Command: "echo ok", IdempotencyKey: client.NewIdempotencyKey()})
			if err == nil {
				break
			}
			if time.Since(lost) > 30*time.Second {
				t.Fatalf("no start 30 s after the work stream's NATS server went: %v", err)
			}
			time.Sleep(100 * time.Millisecond) // between attempts, each a job, while a new leader is elected
		}
		if i == 0 {
			t.Logf("first start accepted %s after the work stream's NATS server went", time.Since(lost).Round(time.Millisecond))
		}
		j := waitStatus(t, cs, r.Job.ID, 60*time.Second, ended)
		out, _, err := cs.Output(t.Context(), r.Job.ID, 0, -1)
		if j.Status != "succeeded" || err != nil || string(out) != "ok\n" {
			t.Errorf("job %s after the NATS server's loss: %s, %q, %v", j.ID, j.Status, out, err)
		}
	}
}
