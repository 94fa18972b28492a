package runner

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	output map[string]*bytes.Buffer
	change chan struct{}
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("runner tests need root for cgroups")
	}
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats did not start")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for name, subj := range map[string]string{proto.WorkStream: proto.WorkSubjects, proto.EventStream: proto.EventSubjects} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}, Retention: jetstream.WorkQueuePolicy}); err != nil {
			t.Fatal(err)
		}
	}
	h := &harness{t: t, nc: nc, js: js, events: map[string][]*proto.Event{}, output: map[string]*bytes.Buffer{}, change: make(chan struct{})}
	cons, err := js.CreateConsumer(ctx, proto.EventStream, jetstream.ConsumerConfig{Durable: "test", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		h.mu.Lock()
		defer h.mu.Unlock()
		job, kind, _ := proto.JobFromSubject(m.Subject())
		if kind == "out" {
			c, err := proto.DecodeChunk(m.Headers(), m.Data())
			if err != nil {
				t.Error(err)
				return
			}
			b := h.output[job]
			if b == nil {
				b = &bytes.Buffer{}
				h.output[job] = b
			}
			if int64(b.Len()) != c.Offset {
				t.Errorf("job %s: chunk at %d after %d bytes", job, c.Offset, b.Len())
			}
			b.Write(c.Data)
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
	return h
}

// startRunner runs a runner until the test ends.
func (h *harness) startRunner(cfg Config) *Runner {
	h.t.Helper()
	if cfg.ID == "" {
		cfg.ID = fmt.Sprintf("test-%d", time.Now().UnixNano())
	}
	cfg.Cgroup.Root = "sbx-runner-test"
	r, err := New(h.nc, cfg)
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

func (h *harness) submit(command string, limits proto.Limits) string {
	h.t.Helper()
	jobSeq++
	id := fmt.Sprintf("job%d-%d", jobSeq, time.Now().UnixNano()%1e6)
	w := &proto.Work{V: proto.Version, JobID: id, Command: command, Cwd: "/tmp", Pool: "default", Limits: limits}
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

func (h *harness) out(id string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b := h.output[id]; b != nil {
		return b.String()
	}
	return ""
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
			for _, e := range h.events[id] {
				kinds = append(kinds, e.Kind)
			}
			h.mu.Unlock()
			if strings.Join(kinds, ",") != "accepted,started,exited" {
				t.Fatalf("events %v", kinds)
			}
		})
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
	w := &proto.Work{V: proto.Version, JobID: "nocwd", Command: "true", Cwd: "/does/not/exist", Pool: "default"}
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
	for !strings.Contains(h.out(id), "up") {
		time.Sleep(10 * time.Millisecond)
	}
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

// TestSlots: a runner never runs more jobs than its slots, and queued jobs start as slots free.
func TestSlots(t *testing.T) {
	h := newHarness(t)
	h.startRunner(Config{Slots: 2})
	var ids []string
	for range 6 {
		ids = append(ids, h.submit("sleep 0.3", proto.Limits{}))
	}
	for _, id := range ids {
		h.exited(id, 20*time.Second)
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
