package natsbus

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/store"
	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
)

// connectRunner connects to nc's server as runner id does: with the runner's inbox prefix.
func connectRunner(t *testing.T, nc *nats.Conn, id string) *nats.Conn {
	t.Helper()
	return natstest.Connect(t, nc.ConnectedUrl(), nats.CustomInboxPrefix(proto.RunnerInbox(id)))
}

// coordinatorLife is one life of a coordinator: its store, bus and service, consuming until stop.
type coordinatorLife struct {
	svc  *coordinator.Service
	bus  *Bus
	out  *Output
	stop func()
}

func startCoordinator(t *testing.T, nc *nats.Conn, dir string) *coordinatorLife {
	t.Helper()
	return startCoordinatorWith(t, nc, dir, func(svc *coordinator.Service) Handler { return svc })
}

// startCoordinatorWith starts a life whose consumer feeds the handler wrap makes of the service.
func startCoordinatorWith(t *testing.T, nc *nats.Conn, dir string, wrap func(*coordinator.Service) Handler) *coordinatorLife {
	t.Helper()
	return startCoordinatorConfig(t, nc, dir, Config{}, wrap)
}

// startCoordinatorConfig starts a life whose bus has cfg.
func startCoordinatorConfig(t *testing.T, nc *nats.Conn, dir string, cfg Config, wrap func(*coordinator.Service) Handler) *coordinatorLife {
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
	bus, err := New(ctx, nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	out, err := OpenOutput(ctx, nc, terms, OutputConfig{Replicas: cfg.Replicas})
	if err != nil {
		t.Fatal(err)
	}
	bus.SetOutput(out)
	svc, err := coordinator.New(ctx, coordinator.Config{}, db, out, bus)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	h := wrap(svc)
	go func() { defer close(done); _ = bus.Consume(ctx, h) }()
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
	return &coordinatorLife{svc: svc, bus: bus, out: out, stop: stop}
}

// fakeRunner publishes what a runner would, straight into the event stream. Its id is "r1" unless
// set, and it knows the claims of the jobs it is given.
type fakeRunner struct {
	t      *testing.T
	js     jetstream.JetStream
	id     string
	claims map[string]string
}

func (r *fakeRunner) runnerID() string {
	if r.id == "" {
		return "r1"
	}
	return r.id
}

func (r *fakeRunner) event(e *proto.Event) {
	r.t.Helper()
	e.V, e.Runner, e.Time, e.Claim = proto.Version, r.runnerID(), time.Now(), r.claims[e.JobID]
	msg := &nats.Msg{Subject: proto.StateSubject(r.runnerID(), e.JobID), Data: proto.Encode(e), Header: nats.Header{}}
	msg.Header.Set(proto.HeaderMsgID, e.MsgID())
	if _, err := r.js.PublishMsg(context.Background(), msg); err != nil {
		r.t.Fatal(err)
	}
}

func (r *fakeRunner) chunk(id string, off int64, data string) {
	r.t.Helper()
	c := &proto.Chunk{JobID: id, Claim: r.claims[id], Offset: off, Data: []byte(data)}
	if _, err := r.js.PublishMsg(context.Background(), &nats.Msg{Subject: proto.OutputSubject(r.runnerID(), id), Data: c.Data, Header: nats.Header(c.Headers())}); err != nil {
		r.t.Fatal(err)
	}
}

// startedJob starts a job on svc and plays its runner's accepted and started events through js; it
// returns the job's id and the runner, to play the rest.
func startedJob(t *testing.T, svc *coordinator.Service, js jetstream.JetStream) (string, *fakeRunner) {
	t.Helper()
	res, err := svc.Start(t.Context(), coordinator.StartRequest{Command: "echo", Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Job.ID
	r := &fakeRunner{t: t, js: js, claims: map[string]string{id: claimOf(t, svc, id)}}
	r.event(&proto.Event{Kind: proto.EventAccepted, JobID: id})
	r.event(&proto.Event{Kind: proto.EventStarted, JobID: id, Pid: 42})
	return id, r
}

// claimOf returns the claim of a job the coordinator started.
func claimOf(t *testing.T, svc *coordinator.Service, id string) string {
	t.Helper()
	j, err := svc.Job(t.Context(), id)
	if err != nil || !proto.ValidClaim(j.Claim) {
		t.Fatalf("job %s has no claim (%v)", id, err)
	}
	return j.Claim
}

// TestRestartResumes: events published while the coordinator is down are applied when it comes back,
// on the same store, and the job's output is whole.
func TestRestartResumes(t *testing.T) {
	nc := natstest.Conn(t)
	dir := t.TempDir()
	ctx := t.Context()
	first := startCoordinator(t, nc, dir)
	js, _ := jetstream.New(nc)
	id, r := startedJob(t, first.svc, js)
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
	nc := natstest.Conn(t)
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

// TestForgedEvents: an event or chunk from a runner that does not run the job, or without the job's
// claim, is dropped and counted; the job keeps running and its output stays the real runner's.
func TestForgedEvents(t *testing.T) {
	nc := natstest.Conn(t)
	c := startCoordinator(t, nc, t.TempDir())
	ctx := t.Context()
	res, err := c.svc.Start(ctx, coordinator.StartRequest{Command: "sleep 100", Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Job.ID
	claim := claimOf(t, c.svc, id)
	js, _ := jetstream.New(nc)
	real := &fakeRunner{t: t, js: js, claims: map[string]string{id: claim}}
	real.event(&proto.Event{Kind: proto.EventAccepted, JobID: id})
	real.event(&proto.Event{Kind: proto.EventStarted, JobID: id, Pid: 42})
	real.chunk(id, 0, "real\n")
	if w, err := c.svc.Wait(ctx, id, 5*time.Second, mustCompile(t, "real")); err != nil || !w.PatternMatched {
		t.Fatalf("the real output did not arrive: %+v %v", w, err)
	}

	code := 0
	other := &fakeRunner{t: t, js: js, id: "r2", claims: map[string]string{id: claim}}
	noClaim := &fakeRunner{t: t, js: js, claims: map[string]string{id: "0123456789abcdef0123456789abcdef"}}
	other.chunk(id, 5, "forged\n")
	other.event(&proto.Event{Kind: proto.EventExited, JobID: id, ExitCode: &code, Reason: proto.ReasonExit, OutputBytes: 5})
	noClaim.chunk(id, 0, "forged\n")
	noClaim.event(&proto.Event{Kind: proto.EventExited, JobID: id, ExitCode: &code, Reason: proto.ReasonExit, OutputBytes: 5})
	// The body names r1 but the subject is r2's: what NATS auth lets r2 publish.
	e := &proto.Event{V: proto.Version, Kind: proto.EventExited, JobID: id, Runner: "r1", Claim: claim, Time: time.Now(), ExitCode: &code, Reason: proto.ReasonExit, OutputBytes: 5}
	if _, err := js.Publish(ctx, proto.StateSubject("r2", id), proto.Encode(e)); err != nil {
		t.Fatal(err)
	}

	if !poll.Within(10*time.Second, func() bool {
		return c.svc.Stats().Forged[coordinator.ForgedState] >= 3 && c.svc.Stats().Forged[coordinator.ForgedOutput] >= 2
	}) {
		t.Fatalf("forged messages counted: %v", c.svc.Stats().Forged)
	}
	j, err := c.svc.Job(ctx, id)
	if err != nil || j.Status != coordinator.StatusRunning || j.Runner != "r1" {
		t.Fatalf("after forged events the job is %+v (%v), want running on r1", j, err)
	}
	rc, _, err := c.svc.Output(ctx, id, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if b, _ := io.ReadAll(rc); string(b) != "real\n" {
		t.Fatalf("output %q, want the real runner's", b)
	}
	// Terminated, not redelivered: nothing is left pending on the event consumer.
	cons, err := js.Consumer(ctx, proto.EventStream, proto.EventConsumer)
	if err != nil {
		t.Fatal(err)
	}
	var info *jetstream.ConsumerInfo
	if !poll.Within(10*time.Second, func() bool {
		if info, err = cons.Info(ctx); err != nil {
			t.Fatal(err)
		}
		return info.NumAckPending == 0 && info.NumPending == 0
	}) {
		t.Fatalf("forged events still pending: %d ack pending, %d pending", info.NumAckPending, info.NumPending)
	}
}

// TestForgedHeartbeat: a heartbeat naming another runner than its subject's is dropped and counted.
func TestForgedHeartbeat(t *testing.T) {
	nc := natstest.Conn(t)
	c := startCoordinator(t, nc, t.TempDir())
	forged := &proto.Heartbeat{V: proto.Version, Runner: "victim", Pool: "default", Slots: 1, Readonly: true, Boot: time.Now(), Time: time.Now()}
	honest := *forged
	honest.Runner = "r2"
	// Consume subscribes in the background, maybe between the two publishes: publish both until
	// both were seen. The assertions below say which one was missed.
	poll.Within(5*time.Second, func() bool {
		if len(c.svc.Runners()) > 0 && c.svc.Stats().Forged[coordinator.ForgedHeartbeat] > 0 {
			return true
		}
		for _, hb := range []*proto.Heartbeat{forged, &honest} {
			if err := nc.Publish(proto.HeartbeatSubject("r2", "default"), proto.Encode(hb)); err != nil {
				t.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return false
	})
	if rs := c.svc.Runners(); len(rs) != 1 || rs[0].ID != "r2" {
		t.Fatalf("runners %+v, want r2 alone", rs)
	}
	if n := c.svc.Stats().Forged[coordinator.ForgedHeartbeat]; n < 1 {
		t.Fatalf("forged heartbeats counted: %d, want at least 1", n)
	}
}

// TestWithdrawTaken: a kill racing a runner's ack answers "taken", never an error: the work stream
// says "not found" or "delete unsuccessful" for a message acked a moment ago.
func TestWithdrawTaken(t *testing.T) {
	nc := natstest.Conn(t)
	c := startCoordinator(t, nc, t.TempDir())
	ctx := t.Context()
	for i := range 20 {
		seq, err := c.bus.Dispatch(ctx, &coordinator.Work{JobID: "w" + string(rune('a'+i)), Command: "true", Cwd: "/", Pool: "default", Claim: "0123456789abcdef"})
		if err != nil {
			t.Fatal(err)
		}
		cons, err := c.bus.js.Consumer(ctx, proto.WorkStream, proto.WorkConsumer("default", proto.CapPlain))
		if err != nil {
			t.Fatal(err)
		}
		msg, err := cons.Next()
		if err != nil {
			t.Fatal(err)
		}
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
		if withdrawn, err := c.bus.Withdraw(ctx, seq); err != nil || withdrawn {
			t.Fatalf("withdraw of taken work %d: %v, %v; want false, nil", seq, withdrawn, err)
		}
	}
}

// TestConsumeConsumerDeleted: when the event consumer is deleted, Consume returns an error (the
// supervisor then exits the process) rather than waiting forever.
func TestConsumeConsumerDeleted(t *testing.T) {
	nc := natstest.Conn(t)
	ctx := t.Context()
	bus, err := New(ctx, nc, Config{ConsumerHeartbeat: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	db, err := store.Open(filepath.Join(dir, "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	terms, err := store.OpenTerminals(filepath.Join(dir, "terminals"))
	if err != nil {
		t.Fatal(err)
	}
	defer terms.Close()
	svc, err := coordinator.New(ctx, coordinator.Config{}, db, terms, bus)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- bus.Consume(ctx, svc) }()
	js, _ := jetstream.New(nc)
	var cons jetstream.Consumer
	poll.Until(t, 10*time.Second, "the event consumer exists", func() bool {
		cons, err = js.Consumer(ctx, proto.EventStream, proto.EventConsumer)
		return err == nil
	})
	poll.Until(t, 10*time.Second, "a pull is waiting", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumWaiting > 0
	})
	if err := js.DeleteConsumer(ctx, proto.EventStream, proto.EventConsumer); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrConsumerGone) {
			t.Fatalf("Consume returned %v, want ErrConsumerGone", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Consume still runs 10 s after its consumer was deleted")
	}
}

// TestWorkConsumersBounded: the coordinator creates work consumers for the pools runners name, up to
// MaxWorkConsumers: heartbeats naming ever new pools do not make it create consumers without end.
func TestWorkConsumersBounded(t *testing.T) {
	nc := natstest.Conn(t)
	ctx := t.Context()
	bus, err := New(ctx, nc, Config{MaxWorkConsumers: 3})
	if err != nil {
		t.Fatal(err)
	}
	for _, pool := range []string{"a", "b", "c"} {
		bus.ensureWork(ctx, pool, pool == "a")
	}
	if _, err := bus.js.Consumer(ctx, proto.WorkStream, proto.WorkConsumer("a", proto.CapReadonly)); err != nil {
		t.Fatalf("pool a's readonly consumer: %v", err)
	}
	if _, err := bus.js.Consumer(ctx, proto.WorkStream, proto.WorkConsumer("b", proto.CapPlain)); err != nil {
		t.Fatalf("pool b's consumer: %v", err)
	}
	if _, err := bus.js.Consumer(ctx, proto.WorkStream, proto.WorkConsumer("c", proto.CapPlain)); err == nil {
		t.Fatal("a fourth work consumer was created past the bound of 3")
	}
	if err := bus.ensureConsumer(ctx, "a", proto.CapPlain); err != nil {
		t.Fatalf("a known consumer is refused: %v", err)
	}
}

// TestConfirmStart: the coordinator confirms the start of a job it queued, and refuses one it
// withdrew; the work it queues carries the moment it stopped waiting for the stream.
func TestConfirmStart(t *testing.T) {
	nc := natstest.Conn(t)
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
	rc := connectRunner(t, nc, "r1")
	ask := func() string {
		t.Helper()
		m, err := rc.Request(proto.ConfirmSubject("r1"), proto.Encode(&proto.Control{V: proto.Version, Op: proto.OpConfirm, JobID: id}), 5*time.Second)
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

func (c *crashing) HandleEvent(ctx context.Context, e *coordinator.Event) error {
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
	base := natstest.Conn(t)
	dir := t.TempDir()
	ctx := t.Context()

	// The first life runs on a connection of its own, closed to crash it: nothing it had in flight
	// is acked or nak'd.
	nc, err := nats.Connect(base.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	var h *crashing
	first := startCoordinatorWith(t, nc, dir, func(svc *coordinator.Service) Handler {
		h = &crashing{Service: svc, hit: make(chan struct{})}
		return h
	})
	svc := first.svc
	js, _ := jetstream.New(base)
	id, r := startedJob(t, svc, js)
	code := 3
	r.event(&proto.Event{Kind: proto.EventExited, JobID: id, ExitCode: &code, Reason: proto.ReasonExit})
	select {
	case <-h.hit:
	case <-time.After(10 * time.Second):
		t.Fatal("the exit never reached the first coordinator")
	}
	nc.Close()
	first.stop()

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

// TestReadyChecksJetStream: Ready fails while the connection is up but jobs cannot be submitted:
// JetStream disabled (as a server does when its storage fails: "too many open files"), or the work
// stream gone. It once checked the connection alone, and /readyz said ok while no job could start.
func TestReadyChecksJetStream(t *testing.T) {
	for _, tt := range []struct {
		name    string
		breakIt func(t *testing.T, ns *server.Server, js jetstream.JetStream)
		want    string
	}{
		{"jetstream disabled", func(t *testing.T, ns *server.Server, _ jetstream.JetStream) {
			if err := ns.DisableJetStream(); err != nil {
				t.Fatal(err)
			}
		}, "JetStream is not usable"},
		{"work stream gone", func(t *testing.T, _ *server.Server, js jetstream.JetStream) {
			if err := js.DeleteStream(t.Context(), proto.WorkStream); err != nil {
				t.Fatal(err)
			}
		}, "work stream"},
		{"work stream refuses writes", func(t *testing.T, _ *server.Server, js jetstream.JetStream) {
			// The stream answers every question about itself, but no job fits in it any more.
			cfg := workStreamConfig(t, js)
			cfg.MaxMsgSize = 16
			if _, err := js.UpdateStream(t.Context(), cfg); err != nil {
				t.Fatal(err)
			}
		}, "last job submission failed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ns := natstest.Server(t)
			nc := natstest.Connect(t, ns.ClientURL())
			bus, err := New(t.Context(), nc, Config{})
			if err != nil {
				t.Fatal(err)
			}
			if err := bus.Ready(t.Context()); err != nil {
				t.Fatalf("Ready on a working server: %v", err)
			}
			work := func(id string) *coordinator.Work {
				return &coordinator.Work{JobID: id, Command: "true", Cwd: "/", Pool: "default", Claim: "0123456789abcdef"}
			}
			if _, err := bus.Dispatch(t.Context(), work("ok1")); err != nil {
				t.Fatal(err)
			}
			tt.breakIt(t, ns, bus.js)
			if _, err := bus.Dispatch(t.Context(), work("broken1")); err == nil {
				t.Fatal("a job was queued on a broken server")
			}
			err = bus.Ready(t.Context())
			if !nc.IsConnected() {
				t.Fatal("the connection dropped: the test checks a connected bus")
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Ready = %v, want an error naming %q", err, tt.want)
			}
			if tt.name != "work stream refuses writes" {
				return
			}
			// Repaired: the next job is queued, and Ready says so at once.
			cfg := workStreamConfig(t, bus.js)
			cfg.MaxMsgSize = proto.MaxMessageBytes
			if _, err := bus.js.UpdateStream(t.Context(), cfg); err != nil {
				t.Fatal(err)
			}
			if _, err := bus.Dispatch(t.Context(), work("ok2")); err != nil {
				t.Fatal(err)
			}
			if err := bus.Ready(t.Context()); err != nil {
				t.Fatalf("Ready after a job was queued again: %v", err)
			}
		})
	}
}

func workStreamConfig(t *testing.T, js jetstream.JetStream) jetstream.StreamConfig {
	t.Helper()
	st, err := js.Stream(t.Context(), proto.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.Config
}
