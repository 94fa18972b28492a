package natsbus

import (
	"context"
	"io"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/store"
	"github.com/sbx-dev/sbx/proto"
)

func startNATS(t *testing.T) *nats.Conn {
	t.Helper()
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
	return nc
}

// coordinatorLife is one life of a coordinator: its store, bus and service, consuming until stop.
type coordinatorLife struct {
	svc  *coordinator.Service
	bus  *Bus
	stop func()
}

func startCoordinator(t *testing.T, nc *nats.Conn, dir string) *coordinatorLife {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	db, err := store.Open(filepath.Join(dir, "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	terms, err := store.OpenTerminals(filepath.Join(dir, "terminals"))
	if err != nil {
		t.Fatal(err)
	}
	bus, err := New(ctx, nc, Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := coordinator.New(ctx, coordinator.Config{}, db, terms, bus)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = bus.Consume(ctx, svc) }()
	var stopped bool
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-done
		terms.Close()
		db.Close()
	}
	t.Cleanup(stop)
	return &coordinatorLife{svc: svc, bus: bus, stop: stop}
}

// fakeRunner publishes what a runner would, straight into the event stream.
type fakeRunner struct {
	t  *testing.T
	js jetstream.JetStream
}

func (r *fakeRunner) event(e *proto.Event) {
	r.t.Helper()
	e.V, e.Runner, e.Time = proto.Version, "r1", time.Now()
	msg := &nats.Msg{Subject: proto.StateSubject(e.JobID), Data: proto.Encode(e), Header: nats.Header{}}
	msg.Header.Set(proto.HeaderMsgID, e.MsgID())
	if _, err := r.js.PublishMsg(context.Background(), msg); err != nil {
		r.t.Fatal(err)
	}
}

func (r *fakeRunner) chunk(id string, off int64, data string) {
	r.t.Helper()
	c := &proto.Chunk{JobID: id, Offset: off, Data: []byte(data)}
	if _, err := r.js.PublishMsg(context.Background(), &nats.Msg{Subject: proto.OutputSubject(id), Data: c.Data, Header: nats.Header(c.Headers())}); err != nil {
		r.t.Fatal(err)
	}
}

// TestRestartResumes: events published while the coordinator is down are applied when it comes back,
// on the same store, and the job's output is whole.
func TestRestartResumes(t *testing.T) {
	nc := startNATS(t)
	dir := t.TempDir()
	ctx := t.Context()
	first := startCoordinator(t, nc, dir)
	res, err := first.svc.Start(ctx, coordinator.StartRequest{Command: "echo", Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Job.ID
	js, _ := jetstream.New(nc)
	r := &fakeRunner{t: t, js: js}
	r.event(&proto.Event{Kind: proto.EventAccepted, JobID: id})
	r.event(&proto.Event{Kind: proto.EventStarted, JobID: id, Pid: 42})
	r.chunk(id, 0, "before restart\n")
	if w, err := first.svc.Wait(ctx, id, 5*time.Second, mustCompile(t, "before")); err != nil || !w.PatternMatched {
		t.Fatalf("first life did not see the output: %+v %v", w, err)
	}
	first.stop()

	// While no coordinator runs, the runner goes on.
	r.chunk(id, 15, "after restart\n")
	code := 0
	r.event(&proto.Event{Kind: proto.EventExited, JobID: id, ExitCode: &code, Reason: proto.ReasonExit, OutputBytes: 29})
	// A retried publish of an event already stored is dropped by the stream.
	r.event(&proto.Event{Kind: proto.EventExited, JobID: id, ExitCode: &code, Reason: proto.ReasonExit, OutputBytes: 29})

	second := startCoordinator(t, nc, dir)
	w, err := second.svc.Wait(ctx, id, 10*time.Second, nil)
	if err != nil || !w.Done || w.Job.Status != coordinator.StatusSucceeded {
		t.Fatalf("after restart: %+v, %v", w, err)
	}
	rc, _, err := second.svc.Output(ctx, id, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if b, _ := io.ReadAll(rc); string(b) != "before restart\nafter restart\n" {
		t.Fatalf("output %q", b)
	}
}

// TestWithdraw: a queued job that no runner took is withdrawn from the work stream by a kill.
func TestWithdraw(t *testing.T) {
	nc := startNATS(t)
	c := startCoordinator(t, nc, t.TempDir())
	ctx := t.Context()
	res, err := c.svc.Start(ctx, coordinator.StartRequest{Command: "sleep 1", Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.svc.Kill(ctx, res.Job.ID, ""); err != nil {
		t.Fatal(err)
	}
	j, err := c.svc.Job(ctx, res.Job.ID)
	if err != nil || j.Status != coordinator.StatusAborted || j.Reason != proto.ReasonKilled {
		t.Fatalf("killed queued job: %+v, %v", j, err)
	}
	info, err := c.bus.work.Info(ctx)
	if err != nil || info.State.Msgs != 0 {
		t.Fatalf("work stream holds %d messages after the withdrawal (%v)", info.State.Msgs, err)
	}
	if err := c.svc.Kill(ctx, res.Job.ID, ""); coordinator.ErrorCode(err) != coordinator.ECONFLICT {
		t.Fatalf("second kill: %v", err)
	}
}
func mustCompile(t *testing.T, pattern string) *regexp.Regexp {
	t.Helper()
	re, err := regexp.Compile(pattern)
	if err != nil {
		t.Fatal(err)
	}
	return re
}

// TestConfirmStart: the coordinator confirms the start of a job it queued, and refuses one it
// withdrew; the work it queues carries the moment it stopped waiting for the stream.
func TestConfirmStart(t *testing.T) {
	nc := startNATS(t)
	c := startCoordinator(t, nc, t.TempDir())
	ctx := t.Context()
	before := time.Now()
	res, err := c.svc.Start(ctx, coordinator.StartRequest{Command: "sleep 1", Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Job.ID
	raw, err := c.bus.work.GetMsg(ctx, res.Job.WorkSeq)
	if err != nil {
		t.Fatal(err)
	}
	w, err := proto.DecodeWork(raw.Data)
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi := before.Add(c.bus.cfg.PublishTimeout).UnixMilli(), time.Now().Add(c.bus.cfg.PublishTimeout).UnixMilli(); w.NotAfter < lo || w.NotAfter > hi {
		t.Fatalf("not_after %d, want the publish deadline in [%d, %d]", w.NotAfter, lo, hi)
	}
	ask := func() string {
		t.Helper()
		m, err := nc.Request(proto.ConfirmSubject, proto.Encode(&proto.Control{V: proto.Version, Op: proto.OpConfirm, JobID: id}), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		r, err := proto.DecodeControlReply(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		return r.Code
	}
	if got := ask(); got != proto.ReplyOK {
		t.Fatalf("queued job: confirmation %s", got)
	}
	if err := c.svc.Kill(ctx, id, ""); err != nil {
		t.Fatal(err)
	}
	if got := ask(); got != proto.ReplyUnknownJob {
		t.Fatalf("withdrawn job: confirmation %s", got)
	}
}

// crashing applies events as the coordinator does until an exit arrives: then it announces the
// exit on hit and never applies it, as a coordinator that died mid-apply.
type crashing struct {
	*coordinator.Service
	hit chan struct{}
}

func (c *crashing) HandleEvent(ctx context.Context, e *proto.Event) error {
	if e.Kind == proto.EventExited {
		close(c.hit)
		<-ctx.Done()
		return ctx.Err()
	}
	return c.Service.HandleEvent(ctx, e)
}

// TestCrashRecovery: a job whose exit was being applied when the coordinator died ends within 5 s
// of the next coordinator's start, not after the event's ack wait (30 s).
func TestCrashRecovery(t *testing.T) {
	base := startNATS(t)
	dir := t.TempDir()
	ctx := t.Context()

	// The first life runs on a connection of its own, closed to crash it: nothing it had in flight
	// is acked or nak'd.
	nc, err := nats.Connect(base.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(filepath.Join(dir, "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	terms, err := store.OpenTerminals(filepath.Join(dir, "terminals"))
	if err != nil {
		t.Fatal(err)
	}
	bus, err := New(ctx, nc, Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := coordinator.New(ctx, coordinator.Config{}, db, terms, bus)
	if err != nil {
		t.Fatal(err)
	}
	lifeCtx, crash := context.WithCancel(ctx)
	h := &crashing{Service: svc, hit: make(chan struct{})}
	consumed := make(chan struct{})
	go func() { defer close(consumed); _ = bus.Consume(lifeCtx, h) }()
	res, err := svc.Start(ctx, coordinator.StartRequest{Command: "echo", Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Job.ID
	js, _ := jetstream.New(base)
	r := &fakeRunner{t: t, js: js}
	r.event(&proto.Event{Kind: proto.EventAccepted, JobID: id})
	r.event(&proto.Event{Kind: proto.EventStarted, JobID: id, Pid: 42})
	code := 3
	r.event(&proto.Event{Kind: proto.EventExited, JobID: id, ExitCode: &code, Reason: proto.ReasonExit})
	select {
	case <-h.hit:
	case <-time.After(10 * time.Second):
		t.Fatal("the exit never reached the first coordinator")
	}
	nc.Close()
	crash()
	<-consumed
	terms.Close()
	db.Close()

	began := time.Now()
	second := startCoordinator(t, base, dir)
	w, err := second.svc.Wait(ctx, id, 10*time.Second, nil)
	took := time.Since(began)
	if err != nil || !w.Done || w.Job.Status != coordinator.StatusFailed {
		t.Fatalf("after the crash: %+v, %v", w, err)
	}
	t.Logf("the job ended %s after the coordinator restarted", took)
	if took > 5*time.Second {
		t.Fatalf("the job ended %s after the restart, want under 5 s", took)
	}
}
