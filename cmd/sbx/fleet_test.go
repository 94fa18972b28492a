package main

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
)

// restartableNATS is an embedded JetStream server that a test stops and starts again on the same
// port and store, as an operator restarts the NATS of a fleet.
type restartableNATS struct {
	t     *testing.T
	port  int
	store string
	ns    *server.Server
}

// newRestartableNATS picks a port for the server and starts it unless it is to come up later.
func newRestartableNATS(t *testing.T, start bool) *restartableNATS {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	n := &restartableNATS{t: t, port: port, store: t.TempDir()}
	if start {
		n.start()
	}
	t.Cleanup(n.stop)
	return n
}

func (n *restartableNATS) url() string { return "nats://127.0.0.1:" + strconv.Itoa(n.port) }

func (n *restartableNATS) start() { n.t.Helper(); n.startWith(true) }

// startWith starts the server, with JetStream or without.
func (n *restartableNATS) startWith(jetStream bool) {
	n.t.Helper()
	n.ns = natstest.Run(n.t, &server.Options{Host: "127.0.0.1", Port: n.port, JetStream: jetStream, StoreDir: n.store})
}

// withJetStream calls f with a JetStream client of its own connection, closed when f returns.
func (n *restartableNATS) withJetStream(f func(jetstream.JetStream)) {
	n.t.Helper()
	nc, err := nats.Connect(n.url())
	if err != nil {
		n.t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		n.t.Fatal(err)
	}
	f(js)
}

// state is the stream's state now.
func (n *restartableNATS) state(stream string) (state jetstream.StreamState) {
	n.t.Helper()
	n.withJetStream(func(js jetstream.JetStream) {
		st, err := js.Stream(n.t.Context(), stream)
		if err != nil {
			n.t.Fatal(err)
		}
		state = st.CachedInfo().State
	})
	return state
}

// msgs is the number of messages the stream holds now.
func (n *restartableNATS) msgs(stream string) uint64 { return n.state(stream).Msgs }

// lastSeq is the sequence of the last message the stream ever stored.
func (n *restartableNATS) lastSeq(stream string) uint64 { return n.state(stream).LastSeq }

// hasConsumer reports whether the stream has the durable consumer.
func (n *restartableNATS) hasConsumer(stream, name string) bool {
	n.t.Helper()
	var err error
	n.withJetStream(func(js jetstream.JetStream) { _, err = js.Consumer(n.t.Context(), stream, name) })
	return err == nil
}

func (n *restartableNATS) stop() {
	if n.ns != nil {
		n.ns.Shutdown()
		n.ns.WaitForShutdown()
		n.ns = nil
	}
}

// part is one sbx process of a fleet (`sbx coordinator` or `sbx runner`) run in-process.
type part struct {
	cancel context.CancelFunc
	done   chan error
	out    *lineWriter
	log    *lineWriter
}

// startPart runs `sbx ARGS...` until stop or the end of the test.
func startPart(t testing.TB, args ...string) *part {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &part{cancel: cancel, done: make(chan error, 1), out: &lineWriter{first: make(chan string, 1)}, log: &lineWriter{first: make(chan string, 1)}}
	go func() { p.done <- run(ctx, args, os.Getenv, p.out, p.log) }()
	t.Cleanup(func() {
		if err := p.stop(); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("sbx %s: %v", args[0], err)
		}
	})
	return p
}

// stop cancels the part and returns what run returned.
func (p *part) stop() error {
	p.cancel()
	select {
	case err, ok := <-p.done:
		if !ok {
			return nil
		}
		close(p.done)
		return err
	case <-time.After(30 * time.Second):
		return errors.New("did not stop within 30 s")
	}
}

// logged reports whether the part's log holds s.
func (p *part) logged(s string) bool {
	return strings.Contains(p.logText(), s)
}

// logText is what the part logged so far.
func (p *part) logText() string {
	p.log.mu.Lock()
	defer p.log.mu.Unlock()
	return p.log.buf.String()
}

// startFleetCoordinator runs `sbx coordinator` against natsURL and returns a client of its API.
func startFleetCoordinator(t testing.TB, natsURL string, extra ...string) (*part, *client.Client) {
	t.Helper()
	p := startPart(t, append([]string{"coordinator", "--nats", natsURL, "--listen", "127.0.0.1:0", "--data", t.TempDir()}, extra...)...)
	select {
	case line := <-p.out.first:
		_, rest, _ := strings.Cut(line, "API ")
		addr, _, _ := strings.Cut(rest, ",")
		return p, client.New(addr, "")
	case err := <-p.done:
		t.Fatalf("coordinator exited: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("coordinator did not start")
	}
	return nil, nil
}

// startFleetRunner runs `sbx runner` with id against natsURL.
func startFleetRunner(t testing.TB, natsURL, id string, extra ...string) *part {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a runner runs jobs in cgroups: needs root")
	}
	return startPart(t, append([]string{"runner", "--nats", natsURL, "--id", id, "--cgroup-root", testCgroupRoot("sbx-fleet-test")}, extra...)...)
}

// waitRunner waits until the coordinator lists the runner and returns it.
func waitRunner(t testing.TB, c *client.Client, id string) client.Runner {
	t.Helper()
	var (
		rs    []client.Runner
		err   error
		found client.Runner
	)
	if !poll.Within(30*time.Second, func() bool {
		rs, err = c.Runners(t.Context())
		for _, r := range rs {
			if r.ID == id {
				found = r
				return true
			}
		}
		return false
	}) {
		t.Fatalf("runner %s did not join: %v %+v", id, err, rs)
	}
	return found
}

// waitStatus polls a job until cond holds, failing after timeout.
func waitStatus(t *testing.T, c *client.Client, id string, timeout time.Duration, cond func(*client.Job) bool) *client.Job {
	t.Helper()
	var (
		j   *client.Job
		err error
	)
	if !poll.Within(timeout, func() bool {
		j, err = c.Job(t.Context(), id)
		return err == nil && cond(j)
	}) {
		t.Fatalf("job %s: %+v, %v after %s", id, j, err, timeout)
	}
	return j
}

func ended(j *client.Job) bool {
	return j.Status == "succeeded" || j.Status == "failed" || j.Status == "aborted"
}

// TestNATSOutage: a start refused while NATS is down (503) never runs, not even once NATS is back,
// and leaves no job (the state cannot be written either); a job that ran through the outage ends
// with its whole output.
func TestNATSOutage(t *testing.T) {
	n := newRestartableNATS(t, true)
	// A lease longer than the outage: past its step-down the coordinator would answer every call
	// 503 until NATS is back (TestCoordinatorCutOff), and this test reads the jobs meanwhile. A
	// runner deadline longer than it too: the job runs through it unless the runner's fence, 6 s by
	// default, fires first, and NATS's restart and the reconnect took longer than that on the slow
	// cgroup v2 guest (the fence: fence_test.go).
	_, c := startFleetCoordinator(t, n.url(), "--lease-ttl", "1m", "--runner-deadline", "1m")
	startFleetRunner(t, n.url(), "outage", "--runner-deadline", "1m")
	waitRunner(t, c, "outage")
	dir := jobDir(t)
	through, err := c.Start(t.Context(), client.StartRequest{Command: "echo before; sleep 2; echo after", Cwd: dir})
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, through.Job.ID, 30*time.Second, func(j *client.Job) bool { return j.Status == "running" })

	n.stop()
	marker := filepath.Join(dir, "ran")
	_, err = c.Start(t.Context(), client.StartRequest{Command: "touch " + marker, Cwd: dir})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != 503 {
		t.Fatalf("start with NATS down: %v, want a 503", err)
	}
	jobs, err := c.Jobs(t.Context(), client.JobsQuery{})
	if err != nil || len(jobs) != 1 || jobs[0].ID != through.Job.ID {
		t.Fatalf("jobs %+v, %v; want the one started before the outage", jobs, err)
	}
	n.start()
	// A job started once the coordinator is back runs: what the refused start left had its chance.
	var ok *client.StartReply
	for deadline := time.Now().Add(30 * time.Second); ok == nil; {
		if ok, err = c.Start(t.Context(), client.StartRequest{Command: "true", Cwd: dir}); err != nil {
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // between attempts, while the coordinator reconnects
		}
	}
	waitStatus(t, c, ok.Job.ID, 30*time.Second, ended)
	time.Sleep(time.Second) // a window in which the refused command may not run
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the refused command ran (%v)", err)
	}
	// Not even queued: the work stream only ever held the second job. (A refused start queued after
	// all is mostly killed by the coordinator once its runner announces it, but it may have run.)
	if seq := n.lastSeq(proto.WorkStream); seq != 2 {
		t.Fatalf("the work stream stored %d messages, want the two started jobs' only", seq)
	}
	if j := waitStatus(t, c, through.Job.ID, 30*time.Second, ended); j.Status != "succeeded" {
		t.Fatalf("the job that ran through the outage: %+v", j)
	}
	var out strings.Builder
	if err := c.Follow(t.Context(), through.Job.ID, 0, &out); err != nil || out.String() != "before\nafter\n" {
		t.Fatalf("output of the job that ran through the outage: %q, %v", out.String(), err)
	}
}

// TestStartBeforeNATS: a runner and a coordinator started before NATS wait for it, saying so, and
// then run jobs; the coordinator makes its data directory; the runner's labels show in GET /v1/runners.
func TestStartBeforeNATS(t *testing.T) {
	n := newRestartableNATS(t, false)
	r := startFleetRunner(t, n.url(), "early", "--label", "zone=a", "--label", "disk=ssd")
	data := filepath.Join(t.TempDir(), "not", "yet", "there")
	coord := startPart(t, "coordinator", "--nats", n.url(), "--listen", "127.0.0.1:0", "--data", data)
	poll.Until(t, 10*time.Second, "runner and coordinator say they wait for NATS", func() bool {
		return r.logged("waiting for NATS") && coord.logged("waiting for NATS")
	})
	select {
	case err := <-r.done:
		t.Fatalf("the runner exited without NATS: %v", err)
	case err := <-coord.done:
		t.Fatalf("the coordinator exited without NATS: %v", err)
	default:
	}
	n.start()
	var c *client.Client
	var addr string
	select {
	case line := <-coord.out.first:
		_, rest, _ := strings.Cut(line, "API ")
		addr, _, _ = strings.Cut(rest, ",")
		c = client.New(addr, "")
	case <-time.After(30 * time.Second):
		t.Fatal("the coordinator did not start once NATS was up")
	}
	if fi, err := os.Stat(data); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("data dir: %v, %v", fi, err)
	}
	got := waitRunner(t, c, "early")
	if len(got.Labels) != 2 || got.Labels["zone"] != "a" || got.Labels["disk"] != "ssd" {
		t.Fatalf("labels %v", got.Labels)
	}
	var table strings.Builder
	env := func(k string) string {
		if k == "SBX_ADDR" {
			return addr
		}
		return ""
	}
	if err := run(t.Context(), []string{"runners"}, env, &table, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "disk=ssd,zone=a") || !strings.Contains(table.String(), "ready") {
		t.Fatalf("sbx runners:\n%s", table.String())
	}
	dir := jobDir(t)
	res, err := c.Start(t.Context(), client.StartRequest{Command: "echo up > out", Cwd: dir})
	if err != nil {
		t.Fatal(err)
	}
	if j := waitStatus(t, c, res.Job.ID, 30*time.Second, ended); j.Status != "succeeded" {
		t.Fatalf("job %+v", j)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "out")); err != nil || string(b) != "up\n" {
		t.Fatalf("the job wrote %q, %v", b, err)
	}
}

// TestLabelFlags: a malformed --label is a usage error, before anything connects.
func TestLabelFlags(t *testing.T) {
	for _, labels := range [][]string{{"nokey"}, {"=v"}, {"a b=c"}, {"k=v", "k=w"}, {strings.Repeat("k", 64) + "=v"}} {
		args := []string{"runner", "--nats", "nats://127.0.0.1:1"}
		for _, l := range labels {
			args = append(args, "--label", l)
		}
		var stderr strings.Builder
		err := run(t.Context(), args, os.Getenv, io.Discard, &stderr)
		if code(err) != 2 || !strings.Contains(err.Error(), "--label") {
			t.Errorf("labels %q: %v (exit %d), want a usage error naming --label", labels, err, code(err))
		}
	}
}

// startSpinner starts a job that runs until killed, waits until it runs, and returns its shell's pid
// on the host (the job's own $$ is its pid in its pid namespace).
func startSpinner(t *testing.T, c *client.Client) (id string, pid int) {
	t.Helper()
	dir := jobDir(t)
	res, err := c.Start(t.Context(), client.StartRequest{Command: "echo $$ > pid; while :; do sleep 0.1; done", Cwd: dir})
	if err != nil {
		t.Fatal(err)
	}
	j := waitStatus(t, c, res.Job.ID, 30*time.Second, func(j *client.Job) bool { return j.Status == "running" && j.Pid != nil })
	var b []byte
	if !poll.Within(10*time.Second, func() bool {
		b, _ = os.ReadFile(filepath.Join(dir, "pid"))
		_, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	}) {
		t.Fatalf("the job wrote no pid: %q", b)
	}
	return res.Job.ID, *j.Pid
}

// processAlive reports whether pid runs (a zombie counts as gone).
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// TestLostJobKilledOnReturn: a runner stalled past the deadline (that does not fence itself) gets
// its job marked lost; when it comes back, the coordinator has it killed, and the job stays lost.
func TestLostJobKilledOnReturn(t *testing.T) {
	n := newRestartableNATS(t, true)
	_, c := startFleetCoordinator(t, n.url(), "--runner-deadline", "2s")
	proxy := natstest.NewStallProxy(t, strings.TrimPrefix(n.url(), "nats://"))
	startFleetRunner(t, proxy.URL(), "stalled", "--runner-deadline", "1h")
	waitRunner(t, c, "stalled")
	id, pid := startSpinner(t, c)

	proxy.Stall()
	stalled := time.Now()
	j := waitStatus(t, c, id, 10*time.Second, ended)
	t.Logf("lost detected %s after the stall (deadline 2 s)", time.Since(stalled).Round(10*time.Millisecond))
	if j.Status != "aborted" || j.Reason != "lost" {
		t.Fatalf("job %+v, want aborted, lost", j)
	}
	if !processAlive(pid) {
		t.Fatal("the job died before its runner came back: the test shows nothing")
	}
	proxy.Resume()
	took := poll.Until(t, 10*time.Second, "the job marked lost is killed after its runner came back", func() bool { return !processAlive(pid) })
	t.Logf("killed %s after the runner came back", took.Round(10*time.Millisecond))
	time.Sleep(time.Second) // a window in which the runner's exit event arrives and may not change the job
	if j, err := c.Job(t.Context(), id); err != nil || j.Status != "aborted" || j.Reason != "lost" {
		t.Fatalf("after the runner's return: %+v, %v; want still aborted, lost", j, err)
	}
}

// TestRunnerFencesItself: a runner cut off from NATS past its deadline kills its jobs by itself,
// while still cut off, and reports them lost once it is back.
func TestRunnerFencesItself(t *testing.T) {
	n := newRestartableNATS(t, true)
	_, c := startFleetCoordinator(t, n.url(), "--runner-deadline", "1h")
	proxy := natstest.NewStallProxy(t, strings.TrimPrefix(n.url(), "nats://"))
	startFleetRunner(t, proxy.URL(), "cutoff", "--runner-deadline", "2s")
	waitRunner(t, c, "cutoff")
	id, pid := startSpinner(t, c)

	proxy.Stall()
	took := poll.Until(t, 10*time.Second, "the cut-off runner kills its job (deadline 2 s)", func() bool { return !processAlive(pid) })
	t.Logf("the runner killed its job %s after it was cut off (deadline 2 s)", took.Round(10*time.Millisecond))
	if j, err := c.Job(t.Context(), id); err != nil || j.Status != "running" {
		t.Fatalf("job %+v, %v: the coordinator (deadline 1 h) should not have decided yet", j, err)
	}
	proxy.Resume()
	j := waitStatus(t, c, id, 30*time.Second, ended)
	if j.Status != "aborted" || j.Reason != "lost" || !strings.Contains(j.Error, "could not reach NATS") {
		t.Fatalf("job %+v, want aborted, lost, saying why", j)
	}
}

// TestDrainShown: a runner stopped with --drain-timeout shows as draining in GET /v1/runners while
// its job finishes, and exits 0 once it did.
func TestDrainShown(t *testing.T) {
	n := newRestartableNATS(t, true)
	_, c := startFleetCoordinator(t, n.url())
	r := startFleetRunner(t, n.url(), "drainer", "--drain-timeout", "30s")
	waitRunner(t, c, "drainer")
	dir := jobDir(t)
	res, err := c.Start(t.Context(), client.StartRequest{Command: "sleep 3; echo done > out", Cwd: dir})
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, res.Job.ID, 30*time.Second, func(j *client.Job) bool { return j.Status == "running" })
	r.cancel() // what SIGTERM does
	poll.Until(t, 10*time.Second, "GET /v1/runners says draining", func() bool { return waitRunner(t, c, "drainer").Draining })
	if j := waitStatus(t, c, res.Job.ID, 30*time.Second, ended); j.Status != "succeeded" {
		t.Fatalf("the job running when the drain began: %+v", j)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("the drained runner: %v, want exit 0", err)
	}
}

// TestAmbiguousPublish: a start whose writes reached NATS but whose acks never came back is refused
// (503) and never runs, whether NATS answers again in time or not; work queued before runs. Since
// the job's record is written to JetStream before its work is queued, the stall now catches the
// record's write first, and no work is queued at all: the settling of an ambiguous work publish
// (withdrawal, and a runner's confirmation of expired work) is tested where it happens,
// coordinator/natsbus TestWithdraw and runner/expired_test.go.
func TestAmbiguousPublish(t *testing.T) {
	n := newRestartableNATS(t, true)
	proxy := natstest.NewStallProxy(t, strings.TrimPrefix(n.url(), "nats://"))
	// A lease longer than the stalls: a coordinator cut off past its step-down would stop leading
	// (TestCoordinatorCutOff), which is not what this test looks at.
	_, c := startFleetCoordinator(t, proxy.URL(), "--lease-ttl", "1m")
	dir := jobDir(t)
	start := func(name string) error {
		_, err := c.Start(t.Context(), client.StartRequest{Command: "touch " + filepath.Join(dir, name), Cwd: dir})
		return err
	}
	// Wait until the coordinator is ready to queue work (its first start succeeds; no runner yet) and
	// consumes events: its start-up talks to NATS, which the stall would break.
	for deadline := time.Now().Add(30 * time.Second); start("ready") != nil || !n.hasConsumer(proto.EventStream, proto.EventConsumer); {
		if time.Now().After(deadline) {
			t.Fatal("the coordinator never got ready")
		}
		time.Sleep(100 * time.Millisecond) // between attempts, each a job
	}

	// 1. The ack is held past the publish timeout, then let through: settled by withdrawal.
	proxy.StallReplies()
	errc := make(chan error, 1)
	go func() { errc <- start("withdrawn") }()
	time.Sleep(6 * time.Second) // past the 5 s publish timeout: the coordinator is settling
	proxy.Resume()
	var apiErr *client.Error
	if err := <-errc; !errors.As(err, &apiErr) || apiErr.Status != 503 {
		t.Fatalf("start whose ack came late: %v, want a 503", err)
	}

	// 2. No answer until the coordinator gave up: the work stays in the stream, expired.
	proxy.StallReplies()
	go func() { errc <- start("expired") }()
	if err := <-errc; !errors.As(err, &apiErr) || apiErr.Status != 503 {
		t.Fatalf("start without an ack: %v, want a 503", err)
	}
	proxy.Resume()

	// A runner joins: it runs the job queued before all this, and nothing else.
	startFleetRunner(t, n.url(), "late")
	waitRunner(t, c, "late")
	poll.Until(t, 30*time.Second, "the job queued before the faults runs", func() bool {
		_, err := os.Stat(filepath.Join(dir, "ready"))
		return err == nil
	})
	if !poll.Within(15*time.Second, func() bool { return n.msgs(proto.WorkStream) == 0 }) {
		t.Fatalf("the work stream still holds %d messages", n.msgs(proto.WorkStream))
	}
	time.Sleep(500 * time.Millisecond) // a window in which the refused starts may not run
	for _, name := range []string{"withdrawn", "expired"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("the refused start %q ran (%v)", name, err)
		}
	}
	jobs, err := c.Jobs(t.Context(), client.JobsQuery{})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		if j.Status == "running" || j.Status == "queued" {
			t.Errorf("job %s (%s) is %s", j.ID, j.Command, j.Status)
		}
	}
}

// TestCoordinatorCutOff: when the coordinator is the one cut off, the runners' silence it hears is
// no evidence: no job is marked lost, and none is killed when the link comes back. Cut off past the
// lease's step-down, it stops leading (its service stops) and takes the lease back, with a new
// service, once the link is back.
func TestCoordinatorCutOff(t *testing.T) {
	n := newRestartableNATS(t, true)
	proxy := natstest.NewStallProxy(t, strings.TrimPrefix(n.url(), "nats://"))
	coord, c := startFleetCoordinator(t, proxy.URL(), "--runner-deadline", "2s", "--lease-ttl", "2s")
	startFleetRunner(t, n.url(), "healthy", "--runner-deadline", "2s")
	waitRunner(t, c, "healthy")
	id, pid := startSpinner(t, c)

	proxy.Stall()
	time.Sleep(5 * time.Second) // past the deadline and the step-down, short of the client's own stale-link detection
	proxy.Resume()
	time.Sleep(3 * time.Second) // the link is back: what would be marked lost now, and killed
	var (
		j   *client.Job
		err error
	)
	poll.Within(10*time.Second, func() bool {
		j, err = c.Job(t.Context(), id)
		return err == nil
	})
	if err != nil || j.Status != "running" {
		t.Fatalf("job %+v, %v after the coordinator's own link was cut; want still running", j, err)
	}
	if !coord.logged("this coordinator stopped leading") {
		t.Error("the coordinator cut off past the lease's step-down did not stop leading")
	}
	if !processAlive(pid) {
		t.Fatal("the job was killed")
	}
}

// TestJetStreamLate: a coordinator and a runner that reach NATS before JetStream answers wait for it,
// saying so, rather than exit.
func TestJetStreamLate(t *testing.T) {
	n := newRestartableNATS(t, false)
	n.startWith(false)
	r := startFleetRunner(t, n.url(), "patient")
	coord := startPart(t, "coordinator", "--nats", n.url(), "--listen", "127.0.0.1:0", "--data", t.TempDir())
	poll.Until(t, 20*time.Second, "the coordinator and the runner say they wait for JetStream", func() bool {
		return coord.logged("waiting for JetStream") && r.logged("waiting for JetStream")
	})
	select {
	case err := <-coord.done:
		t.Fatalf("the coordinator exited: %v", err)
	case err := <-r.done:
		t.Fatalf("the runner exited: %v", err)
	default:
	}
	n.stop()
	n.start()
	var c *client.Client
	select {
	case line := <-coord.out.first:
		_, rest, _ := strings.Cut(line, "API ")
		addr, _, _ := strings.Cut(rest, ",")
		c = client.New(addr, "")
	case <-time.After(30 * time.Second):
		t.Fatal("the coordinator did not start once JetStream was up")
	}
	waitRunner(t, c, "patient")
	res, err := c.Start(t.Context(), client.StartRequest{Command: "true", Cwd: jobDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	if j := waitStatus(t, c, res.Job.ID, 30*time.Second, ended); j.Status != "succeeded" {
		t.Fatalf("job %+v", j)
	}
}
