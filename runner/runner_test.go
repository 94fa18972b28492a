package runner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
	"github.com/sbx-dev/sbx/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.MaybeInit()
	os.Exit(m.Run())
}

// harness is a real NATS server with sbx's streams, and a log of every event runners publish.
type harness struct {
	t  *testing.T
	nc *nats.Conn
	js jetstream.JetStream

	mu     sync.Mutex
	events map[string][]*proto.Event
	output map[string]map[int64][]byte // job → offset → chunk: a retried publish may land late
	stderr map[string]map[int64]bool   // job → offsets of the chunks marked stderr
	change chan struct{}
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarnessWith(t, 0)
	h.consume()
	return h
}

// newHarnessWith makes the harness with the event stream bounded to eventBytes (0: unbounded, as
// natsbus makes it but for the bound) and consumes nothing until consume is called.
func newHarnessWith(t *testing.T, eventBytes int64) *harness {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runner tests need root for cgroups")
	}
	ensureJobUser(t)
	nc := natstest.Conn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: proto.WorkStream, Subjects: []string{proto.WorkSubjects}, Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	events := jetstream.StreamConfig{Name: proto.EventStream, Subjects: []string{proto.EventSubjects}, Retention: jetstream.WorkQueuePolicy, Discard: jetstream.DiscardNew}
	if eventBytes > 0 {
		events.MaxBytes = eventBytes
	}
	if _, err := js.CreateStream(ctx, events); err != nil {
		t.Fatal(err)
	}
	// The coordinator forwards the runners' pulls to JetStream (natsbus checks the reply too).
	if _, err := nc.Subscribe(proto.PullSubjects, func(m *nats.Msg) {
		_, api, _ := strings.Cut(strings.TrimPrefix(m.Subject, proto.PullPrefix("")), ".")
		_ = nc.PublishMsg(&nats.Msg{Subject: "$JS.API." + api, Reply: m.Reply, Data: m.Data})
	}); err != nil {
		t.Fatal(err)
	}
	// The coordinator creates the work consumers; runners only bind to them.
	for _, c := range []string{proto.CapPlain, proto.CapReadonly} {
		if _, err := js.CreateConsumer(ctx, proto.WorkStream, jetstream.ConsumerConfig{
			Durable: proto.WorkConsumer("default", c), FilterSubject: proto.WorkSubject("default", c),
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: -1,
		}); err != nil {
			t.Fatal(err)
		}
	}
	return &harness{t: t, nc: nc, js: js, events: map[string][]*proto.Event{}, output: map[string]map[int64][]byte{}, stderr: map[string]map[int64]bool{}, change: make(chan struct{})}
}

// consume records every event of the event stream, acking each.
func (h *harness) consume() {
	t := h.t
	t.Helper()
	cons, err := h.js.CreateConsumer(t.Context(), proto.EventStream, jetstream.ConsumerConfig{Durable: "test", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		h.mu.Lock()
		defer h.mu.Unlock()
		_, job, kind, _ := proto.ParseEventSubject(m.Subject())
		if kind == proto.KindOutput {
			c, err := proto.DecodeChunk(m.Subject(), m.Headers(), m.Data())
			if err != nil {
				t.Error(err)
				return
			}
			if h.output[job] == nil {
				h.output[job] = map[int64][]byte{}
			}
			h.output[job][c.Offset] = bytes.Clone(c.Data)
			if c.Stderr {
				if h.stderr[job] == nil {
					h.stderr[job] = map[int64]bool{}
				}
				h.stderr[job][c.Offset] = true
			}
		} else {
			e, err := proto.DecodeEvent(m.Data())
			if err != nil {
				t.Error(err)
				return
			}
			h.events[job] = append(h.events[job], e)
		}
		_ = m.Ack()
		close(h.change)
		h.change = make(chan struct{})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
}

// startRunner runs a runner on the harness's connection until the test ends.
func (h *harness) startRunner(cfg Config) *Runner {
	h.t.Helper()
	return h.startRunnerOn(h.nc, cfg)
}

// startRunnerOn runs a runner on nc until the test ends.
func (h *harness) startRunnerOn(nc *nats.Conn, cfg Config) *Runner {
	h.t.Helper()
	if cfg.ID == "" {
		// One id for every test: each runner sweeps what an earlier test's left, and nothing piles up.
		cfg.ID = "test"
	}
	cfg.Cgroup.Root = testCgroupRoot("sbx-runner-test")
	r, err := New(nc, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			h.t.Error(err)
		}
	})
	return r
}

var jobSeq int

// testClaim is the claim of every test job.
const testClaim = "0123456789abcdef"

func (h *harness) submit(command string, limits proto.Limits) string {
	h.t.Helper()
	jobSeq++
	id := fmt.Sprintf("job%d-%d", jobSeq, time.Now().UnixNano()%1e6)
	w := &proto.Work{V: proto.Version, JobID: id, Command: command, Cwd: "/tmp", Pool: "default", Limits: limits, Claim: testClaim}
	if _, err := h.js.Publish(h.t.Context(), proto.WorkSubject("default", proto.CapPlain), proto.Encode(w)); err != nil {
		h.t.Fatal(err)
	}
	return id
}

// exited waits for the job's exited event.
func (h *harness) exited(id string, timeout time.Duration) *proto.Event {
	h.t.Helper()
	deadline := time.After(timeout)
	for {
		h.mu.Lock()
		for _, e := range h.events[id] {
			if e.Kind == proto.EventExited {
				h.mu.Unlock()
				return e
			}
		}
		ch := h.change
		h.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			h.t.Fatalf("job %s did not exit within %s", id, timeout)
		}
	}
}

// out assembles the job's output from its chunks, failing the test on a gap or an overlap.
func (h *harness) out(id string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	chunks := h.output[id]
	offsets := make([]int64, 0, len(chunks))
	for off := range chunks {
		offsets = append(offsets, off)
	}
	slices.Sort(offsets)
	var b bytes.Buffer
	for _, off := range offsets {
		if off != int64(b.Len()) {
			h.t.Errorf("job %s: chunk at %d after %d bytes", id, off, b.Len())
		}
		b.Write(chunks[off])
	}
	return b.String()
}

func TestRunJob(t *testing.T) {
	h := newHarness(t)
	h.startRunner(Config{Slots: 2})
	tests := []struct {
		name, command string
		limits        proto.Limits
		code          int
		reason        string
		output        string
	}{
		{"echo", "echo hi; echo err >&2", proto.Limits{}, 0, proto.ReasonExit, "hi\nerr\n"},
		{"exit code", "exit 3", proto.Limits{}, 3, proto.ReasonExit, ""},
		{"signal", "kill -9 $$", proto.Limits{}, 137, proto.ReasonSignal, ""},
		{"timeout", "echo start; sleep 30", proto.Limits{TimeoutMS: 300}, 143, proto.ReasonTimeout, "start\n"},
		{"output limit", "yes | head -c 100000", proto.Limits{OutputBytes: 1000}, -1, proto.ReasonOutputLimit, strings.Repeat("y\n", 500)},
		{"no runner env", "echo ${SBX_SECRET:-unset}", proto.Limits{}, 0, proto.ReasonExit, "unset\n"},
	}
	t.Setenv("SBX_SECRET", "leak")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := h.submit(tt.command, tt.limits)
			e := h.exited(id, 20*time.Second)
			if e.Reason != tt.reason || (tt.code >= 0 && (e.ExitCode == nil || *e.ExitCode != tt.code)) {
				t.Fatalf("exited %+v (code %v), want reason %s code %d", e, deref(e.ExitCode), tt.reason, tt.code)
			}
			if got := h.out(id); got != tt.output {
				t.Fatalf("output %q, want %q", got, tt.output)
			}
			if e.OutputBytes != int64(len(tt.output)) {
				t.Fatalf("output_bytes %d, want %d", e.OutputBytes, len(tt.output))
			}
			h.mu.Lock()
			kinds := []string{}
			var stages []*proto.Stages
			for _, e := range h.events[id] {
				kinds = append(kinds, e.Kind)
				stages = append(stages, e.Stages)
			}
			h.mu.Unlock()
			if strings.Join(kinds, ",") != "accepted,started,exited" {
				t.Fatalf("events %v", kinds)
			}
			// Each event carries the job's stages so far, in order, on one clock.
			acc, st, ex := stages[0], stages[1], stages[2]
			if acc == nil || st == nil || ex == nil {
				t.Fatalf("stages %+v %+v %+v", acc, st, ex)
			}
			if !(acc.SentUS > 0 && acc.SentUS <= st.CgroupUS && st.CgroupUS <= st.ExecUS && st.ExecUS <= st.SentUS &&
				ex.CgroupUS == st.CgroupUS && ex.ExecUS == st.ExecUS && st.ExecUS <= ex.ExitUS && ex.ExitUS <= ex.SentUS) {
				t.Fatalf("stages not in order: accepted %+v, started %+v, exited %+v", acc, st, ex)
			}
		})
	}
}

// TestSeparateStderr: a job whose work asks for it has its stderr read apart: the chunks of each
// stream carry only that stream's bytes, stderr's marked, at offsets of the one output.
func TestSeparateStderr(t *testing.T) {
	h := newHarness(t)
	h.startRunner(Config{Slots: 2})
	id := h.submitWork(proto.WorkSubject("default", proto.CapPlain), &proto.Work{
		JobID: fmt.Sprintf("apart-%d", time.Now().UnixNano()), SeparateStderr: true,
		Command: "echo o1; echo e1 >&2; sleep 0.2; echo o2; sleep 0.2; echo e2 >&2",
	})
	e := h.exited(id, 20*time.Second)
	if e.OutputBytes != 12 {
		t.Fatalf("output_bytes %d, want 12", e.OutputBytes)
	}
	all := h.out(id)
	h.mu.Lock()
	var stdout, stderr string
	for _, off := range slices.Sorted(maps.Keys(h.output[id])) {
		if data := h.output[id][off]; h.stderr[id][off] {
			stderr += string(data)
		} else {
			stdout += string(data)
		}
	}
	h.mu.Unlock()
	if all != "o1\ne1\no2\ne2\n" && all != "e1\no1\no2\ne2\n" {
		t.Errorf("output %q", all)
	}
	if stdout != "o1\no2\n" || stderr != "e1\ne2\n" {
		t.Errorf("stdout chunks %q, stderr chunks %q", stdout, stderr)
	}

	id = h.submit("echo out; echo err >&2", proto.Limits{})
	h.exited(id, 20*time.Second)
	h.mu.Lock()
	marked := len(h.stderr[id])
	h.mu.Unlock()
	if marked != 0 || h.out(id) != "out\nerr\n" {
		t.Errorf("a job without separate_stderr: %d stderr chunks, output %q", marked, h.out(id))
	}
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestStartFailed(t *testing.T) {
	h := newHarness(t)
	h.startRunner(Config{})
	w := &proto.Work{V: proto.Version, JobID: "nocwd", Command: "true", Cwd: "/does/not/exist", Pool: "default", Claim: testClaim}
	if _, err := h.js.Publish(t.Context(), proto.WorkSubject("default", proto.CapPlain), proto.Encode(w)); err != nil {
		t.Fatal(err)
	}
	e := h.exited("nocwd", 10*time.Second)
	if e.Reason != proto.ReasonStartFailed || !strings.Contains(e.Error, "/does/not/exist") {
		t.Fatalf("got %+v", e)
	}
}

func TestKillRequest(t *testing.T) {
	h := newHarness(t)
	r := h.startRunner(Config{})
	id := h.submit("echo up; setsid sh -c 'sleep 1000' & sleep 1000", proto.Limits{})
	poll.Until(t, 10*time.Second, "the job's output shows up", func() bool { return strings.Contains(h.out(id), "up") })
	req := proto.Encode(&proto.Control{V: proto.Version, Op: proto.OpKill, JobID: id})
	msg, err := h.nc.Request(proto.ControlSubject(r.ID()), req, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if reply, err := proto.DecodeControlReply(msg.Data); err != nil || reply.Code != proto.ReplyOK {
		t.Fatalf("reply %+v, %v", reply, err)
	}
	if e := h.exited(id, 10*time.Second); e.Reason != proto.ReasonKilled {
		t.Fatalf("got %+v", e)
	}
	msg, err = h.nc.Request(proto.ControlSubject(r.ID()), req, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if reply, _ := proto.DecodeControlReply(msg.Data); reply.Code != proto.ReplyUnknownJob {
		t.Fatalf("kill of an ended job: %+v", reply)
	}
}

// TestSlots: a runner never runs more jobs than its slots, and queued jobs start as slots free —
// also when plain and readonly work, taken by two loops sharing the slots, arrive together.
func TestSlots(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testSlots(t, false) })
	t.Run("plain and readonly", func(t *testing.T) {
		requireBwrap(t)
		testSlots(t, true)
	})
}

func testSlots(t *testing.T, mixed bool) {
	h := newHarness(t)
	h.startRunner(Config{Slots: 2})
	var ids []string
	for i := range 6 {
		if mixed && i%2 == 1 {
			ids = append(ids, h.submitWork(proto.WorkSubject("default", proto.CapReadonly),
				&proto.Work{JobID: fmt.Sprintf("slots-ro-%d-%d", i, time.Now().UnixNano()), Command: "sleep 0.3", Readonly: true}))
			continue
		}
		ids = append(ids, h.submit("sleep 0.3", proto.Limits{}))
	}
	for _, id := range ids {
		if e := h.exited(id, 30*time.Second); e.Reason != proto.ReasonExit {
			t.Fatalf("job %s: %+v", id, e)
		}
	}
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	h.mu.Lock()
	for _, id := range ids {
		for _, e := range h.events[id] {
			switch e.Kind {
			case proto.EventAccepted:
				edges = append(edges, edge{e.Time, +1})
			case proto.EventExited:
				edges = append(edges, edge{e.Time, -1})
			}
		}
	}
	h.mu.Unlock()
	// Order by time; at equal times count ends first.
	for i := range edges {
		for k := i + 1; k < len(edges); k++ {
			if edges[k].at.Before(edges[i].at) || (edges[k].at.Equal(edges[i].at) && edges[k].delta < edges[i].delta) {
				edges[i], edges[k] = edges[k], edges[i]
			}
		}
	}
	running, peak := 0, 0
	for _, e := range edges {
		running += e.delta
		peak = max(peak, running)
	}
	if peak != 2 {
		t.Fatalf("peak concurrency %d, want exactly 2 (slots)", peak)
	}
}

// submitWork publishes w on subject and returns its id.
func (h *harness) submitWork(subject string, w *proto.Work) string {
	h.t.Helper()
	w.V, w.Pool, w.Claim = proto.Version, "default", testClaim
	if w.Cwd == "" {
		w.Cwd = "/tmp"
	}
	if _, err := h.js.Publish(h.t.Context(), subject, proto.Encode(w)); err != nil {
		h.t.Fatal(err)
	}
	return w.JobID
}

// heartbeats subscribes to a runner's heartbeats before it starts.
func (h *harness) heartbeats(runnerID string) <-chan *proto.Heartbeat {
	h.t.Helper()
	ch := make(chan *proto.Heartbeat, 64)
	sub, err := h.nc.Subscribe(proto.HeartbeatSubject(runnerID, "*"), func(m *nats.Msg) {
		hb, err := proto.DecodeHeartbeat(m.Data)
		if err != nil {
			h.t.Error(err)
			return
		}
		select {
		case ch <- hb:
		default:
		}
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return ch
}

func firstHeartbeat(t *testing.T, ch <-chan *proto.Heartbeat) *proto.Heartbeat {
	t.Helper()
	select {
	case hb := <-ch:
		return hb
	case <-time.After(30 * time.Second):
		t.Fatal("no heartbeat")
		return nil
	}
}

// requireBwrap skips unless bubblewrap is installed.
func requireBwrap(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bwrap not installed (apt-get install bubblewrap)")
	}
}

// TestReadonlyJob runs readonly work end to end: the probe passes, the heartbeat says so, the runner
// takes work from the readonly subject and runs it with nothing writable and a minimal environment.
func TestReadonlyJob(t *testing.T) {
	requireBwrap(t)
	h := newHarness(t)
	t.Setenv("RO_RUNNER_SECRET", "leak")
	id := "ro" // a fixed runner id: its cgroup root is swept by the next run, not left behind
	hbs := h.heartbeats(id)
	h.startRunner(Config{ID: id, Slots: 2})
	if hb := firstHeartbeat(t, hbs); !hb.Readonly || hb.ReadonlyReason != "" {
		t.Fatalf("heartbeat readonly=%v reason %q, want readonly", hb.Readonly, hb.ReadonlyReason)
	}
	dir := jobUserDir(t) // the job's user could write there, but for the sandbox
	tests := []struct {
		name, command string
		env           map[string]string
		code          int // -1: any non-zero
		output        string
		absent        string
	}{
		{name: "write cwd", command: "touch created", code: -1, absent: filepath.Join(dir, "created")},
		{name: "write tmp", command: "touch /tmp/" + id, code: -1, absent: "/tmp/" + id},
		{name: "read", command: "cat /proc/self/comm && ls /", code: 0},
		{name: "runner env", command: "echo ${RO_RUNNER_SECRET:-unset} $REQUESTED", env: map[string]string{"REQUESTED": "yes"}, code: 0, output: "unset yes\n"},
		{name: "env names", command: "env | cut -d= -f1 | grep -v -e '^PWD$' -e '^SHLVL$' -e '^_$' | sort", env: map[string]string{"REQUESTED": "yes"}, code: 0,
			output: "HOME\nLANG\nLOGNAME\nPATH\nREQUESTED\nTERM\nUSER\n"}, // USER and LOGNAME: the job user's
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			jobID := h.submitWork(proto.WorkSubject("default", proto.CapReadonly),
				&proto.Work{JobID: fmt.Sprintf("%s-%d", id, i), Command: tt.command, Cwd: dir, Env: tt.env, Readonly: true})
			e := h.exited(jobID, 20*time.Second)
			if e.Reason == proto.ReasonStartFailed || e.ExitCode == nil {
				t.Fatalf("exited %+v", e)
			}
			if tt.code == -1 && *e.ExitCode == 0 || tt.code >= 0 && *e.ExitCode != tt.code {
				t.Fatalf("exit code %d, want %d; output %q", *e.ExitCode, tt.code, h.out(jobID))
			}
			if tt.output != "" && h.out(jobID) != tt.output {
				t.Fatalf("output %q, want %q", h.out(jobID), tt.output)
			}
			if tt.absent != "" {
				if _, err := os.Stat(tt.absent); err == nil {
					os.Remove(tt.absent)
					t.Fatalf("%s was created", tt.absent)
				}
			}
		})
	}
}

// TestReadonlyProbeFails: with a bwrap that cannot start first on PATH, the runner reports
// readonly: false with the probe's reason, takes nothing from the readonly subject, and a readonly
// job that reaches it anyway ends start_failed without running.
func TestReadonlyProbeFails(t *testing.T) {
	h := newHarness(t)
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "bwrap"), []byte("#!/bin/sh\necho 'bwrap: broken' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	id := "noro" // a fixed runner id, as above
	hbs := h.heartbeats(id)
	h.startRunner(Config{ID: id})
	hb := firstHeartbeat(t, hbs)
	if hb.Readonly || !strings.Contains(hb.ReadonlyReason, "bwrap: broken") {
		t.Fatalf("heartbeat readonly=%v reason %q, want false with the probe's failure", hb.Readonly, hb.ReadonlyReason)
	}

	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	// Misrouted readonly work on the plain subject: the runner takes it and refuses to start it.
	misrouted := h.submitWork(proto.WorkSubject("default", proto.CapPlain),
		&proto.Work{JobID: id + "-plain", Command: "touch " + marker, Cwd: dir, Readonly: true})
	e := h.exited(misrouted, 20*time.Second)
	if e.Reason != proto.ReasonStartFailed || !strings.Contains(e.Error, "bwrap: broken") {
		t.Fatalf("exited %+v, want start_failed with the probe's reason", e)
	}
	// Readonly work on the readonly subject: nobody takes it.
	queued := h.submitWork(proto.WorkSubject("default", proto.CapReadonly),
		&proto.Work{JobID: id + "-ro", Command: "touch " + marker, Cwd: dir, Readonly: true})
	time.Sleep(3 * time.Second) // a window in which nobody may take it
	h.mu.Lock()
	events := len(h.events[queued])
	h.mu.Unlock()
	if events != 0 {
		t.Fatalf("readonly work was taken by a runner whose probe failed (%d events)", events)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a readonly command ran")
	}
}

// TestBackpressure: while the event stream is full the runner stops reading the job's pipe, so the job
// blocks on write; once there is room again every byte arrives, in order, and the job ends.
func TestBackpressure(t *testing.T) {
	h := newHarnessWith(t, 256<<10)
	r := h.startRunner(Config{})
	id := h.submit("seq 1 300000; echo done", proto.Limits{})
	want := func() string {
		var b strings.Builder
		for i := 1; i <= 300000; i++ {
			fmt.Fprintf(&b, "%d\n", i)
		}
		return b.String() + "done\n"
	}()

	// Nothing consumes: the stream fills and the job must stall, not finish. The second is a window
	// in which the job, were it not held back, would finish.
	time.Sleep(time.Second)
	info, err := h.js.Stream(t.Context(), proto.EventStream)
	if err != nil {
		t.Fatal(err)
	}
	st, err := info.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.State.Bytes > 256<<10 || st.State.Msgs == 0 {
		t.Fatalf("event stream holds %d bytes in %d messages; want it full, within 256 KiB", st.State.Bytes, st.State.Msgs)
	}
	if len(want) <= 256<<10 {
		t.Fatal("the job's output must be larger than the stream")
	}
	r.mu.Lock()
	_, running := r.jobs[id]
	r.mu.Unlock()
	if !running {
		t.Fatal("the job ended while its output could not be published")
	}

	h.consume()
	e := h.exited(id, 30*time.Second)
	if e.Reason != proto.ReasonExit || e.OutputBytes != int64(len(want)) {
		t.Fatalf("exited %+v, want a normal exit with %d bytes", e, len(want))
	}
	if got := h.out(id); got != want {
		t.Fatalf("output differs: %d bytes, want %d", len(got), len(want))
	}
}

// testCgroupRoot names the cgroup root of this checkout's tests: fixed, so that each run sweeps what
// the last one left, and different per checkout, so that two checkouts testing at once never sweep
// each other's jobs.
func testCgroupRoot(name string) string {
	wd, _ := os.Getwd()
	sum := sha256.Sum256([]byte(wd))
	return name + "-" + hex.EncodeToString(sum[:4])
}

// TestTTYJob: a tty job's prompt shows, the answer sent through the control subject reaches it, a
// resize reaches its terminal, and activity events say when it waits for input and where it
// listens.
func TestTTYJob(t *testing.T) {
	h := newHarness(t)
	r := h.startRunner(Config{ScanInterval: 20 * time.Millisecond})
	control := func(c *proto.Control) *proto.ControlReply {
		t.Helper()
		c.V = proto.Version
		msg, err := h.nc.Request(proto.ControlSubject(r.ID()), proto.Encode(c), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		reply, err := proto.DecodeControlReply(msg.Data)
		if err != nil {
			t.Fatal(err)
		}
		return reply
	}
	awaitOut := func(id, want string) {
		t.Helper()
		if !poll.Within(15*time.Second, func() bool { return strings.Contains(h.out(id), want) }) {
			t.Fatalf("output never showed %q: %q", want, h.out(id))
		}
	}
	awaitActivity := func(id string, ok func(*proto.Event) bool) *proto.Event {
		t.Helper()
		var found *proto.Event
		poll.Until(t, 15*time.Second, "an activity event of "+id, func() bool {
			h.mu.Lock()
			defer h.mu.Unlock()
			for _, e := range h.events[id] {
				if e.Kind == proto.EventActivity && ok(e) {
					found = e
					return true
				}
			}
			return false
		})
		return found
	}

	id := h.submitWork(proto.WorkSubject("default", proto.CapPlain), &proto.Work{JobID: "tty-prompt", TTY: true,
		TTYSize: &proto.TTYSize{Rows: 30, Cols: 90},
		Command: `echo "term=$TERM size=$(stty size)"; read -p 'Continue? (y/n) ' x; echo got=$x; trap 'echo "winch $(stty size)"; exit 0' WINCH; while :; do sleep 0.05; done`})
	awaitOut(id, "Continue? (y/n) ")
	if e := awaitActivity(id, func(e *proto.Event) bool { return e.InputSince != nil }); e.Seq < 1 {
		t.Fatalf("activity %+v", e)
	}
	if reply := control(&proto.Control{Op: proto.OpStdin, JobID: id, Data: []byte("y\n")}); reply.Code != proto.ReplyOK {
		t.Fatalf("stdin: %+v", reply)
	}
	awaitOut(id, "got=y")
	awaitActivity(id, func(e *proto.Event) bool { return e.InputSince == nil })
	if reply := control(&proto.Control{Op: proto.OpResize, JobID: id, Size: &proto.TTYSize{Rows: 40, Cols: 120}}); reply.Code != proto.ReplyOK {
		t.Fatalf("resize: %+v", reply)
	}
	awaitOut(id, "winch 40 120")
	if e := h.exited(id, 10*time.Second); e.Reason != proto.ReasonExit || *e.ExitCode != 0 {
		t.Fatalf("exited %+v", e)
	}
	if out := h.out(id); !strings.Contains(out, "term=xterm-256color size=30 90\r\n") {
		t.Fatalf("output %q", out)
	}
	if reply := control(&proto.Control{Op: proto.OpResize, JobID: id, Size: &proto.TTYSize{Rows: 4, Cols: 4}}); reply.Code != proto.ReplyUnknownJob {
		t.Fatalf("resize of an ended job: %+v", reply)
	}

	plain := h.submit("sleep 1000", proto.Limits{})
	if reply := control(&proto.Control{Op: proto.OpResize, JobID: plain, Size: &proto.TTYSize{Rows: 4, Cols: 4}}); reply.Code != proto.ReplyRefused && reply.Code != proto.ReplyUnknownJob {
		t.Fatalf("resize of a job without a terminal: %+v", reply)
	}

	web := h.submit("exec python3 -m http.server 0 --bind 127.0.0.1", proto.Limits{})
	e := awaitActivity(web, func(e *proto.Event) bool { return len(e.Ports) > 0 })
	if e.Ports[0].Address != "127.0.0.1" || e.Ports[0].Port == 0 {
		t.Fatalf("ports %+v", e.Ports)
	}
}

// TestHeartbeatsOwnConnection: a runner whose connection stalls (nothing it writes gets through,
// nothing comes back: a slow link, a starved server) keeps heartbeating on the connection of its
// own, so its fence does not take its job for cut off; once the connection flows again the job ends
// as it would have. With the heartbeats on the stalled connection the job is fenced, reason lost.
func TestHeartbeatsOwnConnection(t *testing.T) {
	h := newHarness(t)
	proxy := natstest.NewStallProxy(t, strings.TrimPrefix(h.nc.ConnectedUrl(), "nats://"))
	beats := h.heartbeats("beats")
	h.startRunnerOn(natstest.Connect(t, proxy.URL()), Config{ID: "beats", Deadline: 2 * time.Second, Heartbeats: natstest.Connect(t, h.nc.ConnectedUrl())})
	id := h.submit("echo start; sleep 5; echo end", proto.Limits{})
	h.started(id, 10*time.Second)
	proxy.Stall()
	for range len(beats) {
		<-beats
	}
	// The stall outlasts the fence (1.5 s of a 2 s deadline) twice over: letting that time pass is
	// the test.
	time.Sleep(3 * time.Second)
	heard := len(beats)
	proxy.Resume()
	if heard < 3 {
		t.Errorf("%d heartbeats in the 3 s the runner's connection stalled, want one every 500 ms", heard)
	}
	if e := h.exited(id, 10*time.Second); e.Reason != proto.ReasonExit || h.out(id) != "start\nend\n" {
		t.Errorf("the job ended %s (%s) with output %q, want its exit and all of it", e.Reason, e.Error, h.out(id))
	}
}
