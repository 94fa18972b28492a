package natsbus

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
)

// heartbeat publishes a heartbeat of runner in pool on the subject of subjectPool until the
// coordinator counted it, as a runner or as forged.
func heartbeat(t *testing.T, nc *nats.Conn, c *coordinatorLife, runner, subjectPool, pool string) {
	t.Helper()
	hb := &proto.Heartbeat{V: proto.Version, Runner: runner, Pool: pool, Slots: 1, Boot: time.Now(), Time: time.Now()}
	seen := func() int {
		n := int(c.svc.Stats().Forged[coordinator.ForgedHeartbeat])
		for _, r := range c.svc.Runners() {
			if r.ID == runner && r.Pool == pool {
				n++
			}
		}
		return n
	}
	before := seen()
	poll.Until(t, 5*time.Second, fmt.Sprintf("the heartbeat of %s in %s is counted", runner, pool), func() bool {
		if seen() != before {
			return true
		}
		if err := nc.Publish(proto.HeartbeatSubject(runner, subjectPool), proto.Encode(hb)); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return false
	})
}

func hasConsumer(t *testing.T, b *Bus, name string) bool {
	t.Helper()
	_, err := b.js.Consumer(t.Context(), proto.WorkStream, name)
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

// TestHeartbeatPools: a runner's heartbeats make work consumers only for the pool their subject
// names (which NATS permissions hold to the runner's creds) and for at most MaxPoolsPerRunner pools;
// the rest are dropped and counted. Before, one runner's heartbeats naming new pools filled the
// coordinator's 512 consumers and a real new pool's jobs were refused.
func TestHeartbeatPools(t *testing.T) {
	nc := natstest.Conn(t)
	ctx := t.Context()
	c := startCoordinatorConfig(t, nc, t.TempDir(), Config{MaxWorkConsumers: 6, MaxPoolsPerRunner: 2},
		func(svc *coordinator.Service) Handler { return svc })
	bus := c.bus

	// A heartbeat whose body names another pool than its subject.
	heartbeat(t, nc, c, "r1", "mine", "theirs")
	if n := c.svc.Stats().Forged[coordinator.ForgedHeartbeat]; n != 1 {
		t.Fatalf("forged heartbeats %d, want 1", n)
	}
	if hasConsumer(t, bus, proto.WorkConsumer("theirs", proto.CapPlain)) || hasConsumer(t, bus, proto.WorkConsumer("mine", proto.CapPlain)) {
		t.Fatal("a heartbeat naming two pools made a work consumer")
	}
	// A greedy runner names ten pools: two count.
	for i := range 10 {
		heartbeat(t, nc, c, "greedy", fmt.Sprint("p", i), fmt.Sprint("p", i))
	}
	for i := range 10 {
		if got, want := hasConsumer(t, bus, proto.WorkConsumer(fmt.Sprint("p", i), proto.CapPlain)), i < 2; got != want {
			t.Fatalf("pool p%d has a consumer: %v, want %v", i, got, want)
		}
	}
	if n := c.svc.Stats().Forged[coordinator.ForgedHeartbeat]; n != 9 {
		t.Fatalf("forged heartbeats %d, want 9", n)
	}
	// A new pool's runner still gets its consumer, and its jobs queue.
	heartbeat(t, nc, c, "honest", "fresh", "fresh")
	if !hasConsumer(t, bus, proto.WorkConsumer("fresh", proto.CapPlain)) {
		t.Fatal("the new pool got no work consumer")
	}
	if _, err := bus.Dispatch(ctx, &coordinator.Work{JobID: "j1", Command: "true", Cwd: "/", Pool: "fresh", Claim: "c"}); err != nil {
		t.Fatalf("a job of the new pool: %v", err)
	}
}

// TestIdleWorkConsumersRemoved: the work consumers of a pool no runner and no dispatch named for
// WorkConsumerIdle are removed, its queued work kept; a named pool's stay.
func TestIdleWorkConsumersRemoved(t *testing.T) {
	nc := natstest.Conn(t)
	ctx := t.Context()
	bus, err := New(ctx, nc, Config{WorkConsumerIdle: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	for _, pool := range []string{"gone", "live"} {
		if !bus.pools.name("r-"+pool, pool, t0) {
			t.Fatal("a runner's first pool was refused")
		}
		bus.ensureWork(ctx, pool, true)
	}
	if _, err := bus.Dispatch(ctx, &coordinator.Work{JobID: "j1", Command: "true", Cwd: "/", Pool: "gone", Claim: "c"}); err != nil {
		t.Fatal(err)
	}
	bus.pools.dispatched("gone", t0) // as if dispatched at t0
	if err := bus.removeIdleWork(ctx, t0.Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if !hasConsumer(t, bus, proto.WorkConsumer("gone", proto.CapPlain)) {
		t.Fatal("a pool named 30 s ago lost its consumer")
	}
	bus.pools.name("r-live", "live", t0.Add(90*time.Second))
	if err := bus.removeIdleWork(ctx, t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		proto.WorkConsumer("gone", proto.CapPlain): false, proto.WorkConsumer("gone", proto.CapReadonly): false,
		proto.WorkConsumer("live", proto.CapPlain): true, proto.WorkConsumer("live", proto.CapReadonly): true,
	} {
		if got := hasConsumer(t, bus, name); got != want {
			t.Errorf("consumer %s exists: %v, want %v", name, got, want)
		}
	}
	if info, err := bus.work.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("queued work after the removal: %+v, %v", info, err)
	}
	// The pool's next dispatch makes its consumer again.
	if _, err := bus.Dispatch(ctx, &coordinator.Work{JobID: "j2", Command: "true", Cwd: "/", Pool: "gone", Claim: "c"}); err != nil {
		t.Fatal(err)
	}
	if !hasConsumer(t, bus, proto.WorkConsumer("gone", proto.CapPlain)) {
		t.Fatal("a dispatch did not make the consumer again")
	}
}

// TestWorkGoesToTheRunnersInbox: the coordinator forwards a runner's pull, and its confirmation
// request, only when the reply is in that runner's inbox. Before, runner creds could pull from
// JetStream directly with any reply: a reply on a stream's subject stored the work (command,
// environment, claim) in that stream, for ever.
func TestWorkGoesToTheRunnersInbox(t *testing.T) {
	nc := natstest.Conn(t)
	c := startCoordinator(t, nc, t.TempDir())
	ctx := t.Context()
	res, err := c.svc.Start(ctx, coordinator.StartRequest{Command: "secret-command", Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	rc := connectRunner(t, nc, "r1")
	other := connectRunner(t, nc, "r2")
	otherInbox, err := other.SubscribeSync(proto.RunnerInbox("r2") + ".>")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Flush(); err != nil {
		t.Fatal(err)
	}
	trap := proto.WorkSubject("trap", proto.CapPlain) // where work is stored; no consumer reads it
	next := proto.PullPrefix("r1") + ".CONSUMER.MSG.NEXT." + proto.WorkStream + "." + proto.WorkConsumer("default", proto.CapPlain)
	if err := rc.PublishRequest(next, trap, []byte(`{"batch":1,"expires":1000000000}`)); err != nil {
		t.Fatal(err)
	}
	if err := rc.PublishRequest(next, proto.RunnerInbox("r2")+".x", []byte(`{"batch":1,"expires":1000000000}`)); err != nil {
		t.Fatal(err)
	}
	if err := rc.PublishRequest(proto.ConfirmSubject("r1"), proto.RunnerInbox("r2")+".y", proto.Encode(&proto.Control{V: proto.Version, Op: proto.OpConfirm, JobID: res.Job.ID})); err != nil {
		t.Fatal(err)
	}
	// The runner's own pull, through the same forwarder after the others, gets the work: had either
	// pull before it been forwarded, the one message would be out to the trap or to r2's inbox.
	rjs, err := jetstream.NewWithAPIPrefix(rc, proto.PullPrefix("r1"))
	if err != nil {
		t.Fatal(err)
	}
	cons, err := rjs.Consumer(ctx, proto.WorkStream, proto.WorkConsumer("default", proto.CapPlain))
	if err != nil {
		t.Fatalf("bind through the coordinator: %v", err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("pull through the coordinator: %v", err)
	}
	w, err := proto.DecodeWork(msg.Data())
	if err != nil || w.JobID != res.Job.ID {
		t.Fatalf("work %+v, %v", w, err)
	}
	// Nothing a runner sees of its work names the work stream's key.
	seen := fmt.Sprint(msg.Subject(), msg.Reply(), msg.Headers())
	if info, err := cons.Info(ctx); err == nil {
		seen += fmt.Sprintf("%+v", *info)
	}
	if strings.Contains(seen, c.bus.workKey) {
		t.Fatalf("a runner sees the work key %s in %s", c.bus.workKey, seen)
	}
	// The confirmation's forwarder has handled the bad request once it answers a good one.
	if m, err := rc.Request(proto.ConfirmSubject("r1"), proto.Encode(&proto.Control{V: proto.Version, Op: proto.OpConfirm, JobID: res.Job.ID}), 5*time.Second); err != nil {
		t.Fatal(err)
	} else if r, err := proto.DecodeControlReply(m.Data); err != nil || r.Code != proto.ReplyOK {
		t.Fatalf("confirmation %+v, %v", r, err)
	}
	if err := other.Flush(); err != nil { // r2 has read whatever the coordinator sent it before
		t.Fatal(err)
	}
	if n, _, err := otherInbox.Pending(); err != nil || n != 0 {
		t.Fatalf("runner r2's inbox got %d messages (%v), want none", n, err)
	}
}

// TestWorkStreamTakesOnlyWork: the work stream takes in only its ingest subjects, whose key runners
// cannot read, so an answer of JetStream to a runner, which goes to whatever reply the runner names,
// is never stored as work. Before, the stream took in sbx.v1.work.>: the acknowledgement of an event
// publish aimed at a pool no runner serves stayed there, and enough of them filled the stream.
func TestWorkStreamTakesOnlyWork(t *testing.T) {
	nc := natstest.Conn(t)
	c := startCoordinator(t, nc, t.TempDir())
	ctx := t.Context()
	rc := connectRunner(t, nc, "r1")
	trap := proto.WorkSubject("trap", proto.CapPlain)
	if err := rc.PublishRequest(proto.StateSubject("r1", "j1"), trap, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	// The event stream answers in order: once the second publish is acknowledged, the first
	// acknowledgement went out.
	rjs, err := jetstream.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rjs.Publish(ctx, proto.StateSubject("r1", "j2"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.bus.work.GetLastMsgForSubject(ctx, trap); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("an acknowledgement was stored as work on %s: %v", trap, err)
	}
	// Work the coordinator queues is stored under its work subject, where its consumer reads it.
	res, err := c.svc.Start(ctx, coordinator.StartRequest{Command: "true", Cwd: "/", Pool: "p"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.bus.work.GetMsg(ctx, res.Job.WorkSeq)
	if err != nil || m.Subject != proto.WorkSubject("p", proto.CapPlain) {
		t.Fatalf("work stored as %+v (%v), want on %s", m, err, proto.WorkSubject("p", proto.CapPlain))
	}
}
