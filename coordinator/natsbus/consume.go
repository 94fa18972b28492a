package natsbus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/proto"
)

// Handler applies what the runners report. *coordinator.Service implements it.
type Handler interface {
	HandleEvent(ctx context.Context, e *coordinator.Event) error
	HandleChunk(ctx context.Context, c *coordinator.Chunk) error
	HandleHeartbeat(h *coordinator.Heartbeat)
	// Forged counts a message of a kind (coordinator.ForgedState...) dropped as forged and returns
	// coordinator.ErrForged wrapped with why.
	Forged(kind, why string) error
	// ConfirmStart reports whether the job is queued and may start (see proto.Work.NotAfter).
	ConfirmStart(id string) bool
}

// ErrConsumerGone is returned by Consume when the coordinator's event consumer was deleted under it.
var ErrConsumerGone = errors.New("natsbus: the event consumer is gone")

// Consume feeds every event of the event stream and every heartbeat to h, answers the runners'
// start confirmations (proto.ConfirmSubject), forwards their pulls for work (proto.PullPrefix) and
// removes the work consumers of pools no runner names any more, until ctx ends. An event is
// acked only after h stored it, and after the output stream stored the output it carried
// (SetOutput); one h cannot place yet is redelivered shortly; one that does not
// decode, or is forged, is logged and terminated. A heartbeat counts only from the runner and for
// the pool its subject names (with NATS auth, the runner that published it, and a pool its creds
// name), and for at most MaxPoolsPerRunner pools a runner. Each heartbeat also makes sure the work
// consumers of the runner's pool exist: runners bind to them but may not create them. Consume
// returns an error when the event consumer is deleted or its iterator stops while ctx lives.
func (b *Bus) Consume(ctx context.Context, h Handler) error {
	sub, err := b.nc.Subscribe(proto.HeartbeatSubjects, func(m *nats.Msg) { b.heartbeat(ctx, h, m.Subject, m.Data) })
	if err != nil {
		return fmt.Errorf("subscribe heartbeats: %w", err)
	}
	defer sub.Unsubscribe()
	confirm, err := b.nc.Subscribe(proto.ConfirmSubjects, func(m *nats.Msg) {
		runner, _ := proto.RunnerFromConfirm(m.Subject)
		if !inInbox(m.Reply, runner) {
			b.cfg.Logger.Error("dropping a confirmation whose reply is not its runner's inbox", "subject", m.Subject, "reply", m.Reply)
			return
		}
		reply := &proto.ControlReply{V: proto.Version, Code: proto.ReplyOK}
		c, err := proto.DecodeControl(m.Data)
		switch {
		case err != nil:
			reply.Code, reply.Message = proto.ReplyInvalid, err.Error()
		case c.Op != proto.OpConfirm:
			reply.Code, reply.Message = proto.ReplyInvalid, "op "+c.Op+" is not confirm"
		case !h.ConfirmStart(c.JobID):
			reply.Code, reply.Message = proto.ReplyUnknownJob, "job "+c.JobID+" is not queued: its start was refused or it ended"
		}
		if err := m.Respond(proto.Encode(reply)); err != nil {
			b.cfg.Logger.Warn("answer start confirmation", "err", err)
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe confirmations: %w", err)
	}
	defer confirm.Unsubscribe()
	pull, err := b.nc.QueueSubscribe(proto.PullSubjects, queueGroup, b.forwardPull)
	if err != nil {
		return fmt.Errorf("subscribe pulls: %w", err)
	}
	defer pull.Unsubscribe()
	var sweeping sync.WaitGroup
	sweepCtx, stopSweep := context.WithCancel(ctx)
	sweeping.Add(1)
	go func() { defer sweeping.Done(); b.sweepWork(sweepCtx) }()
	defer sweeping.Wait()
	defer stopSweep()

	// The deliveries a crashed coordinator left unacked would wait out their AckWait (30 s) before
	// being delivered again, holding jobs `running` after their exit. There is one coordinator: at its
	// start nothing else consumes, so the consumer is made anew and delivers at once everything still
	// in the (work-queue) stream, acked events being gone from it. Applying an event twice is harmless.
	if err := b.js.DeleteConsumer(ctx, proto.EventStream, proto.EventConsumer); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("reset consumer %s: %w", proto.EventConsumer, err)
	}
	cons, err := b.js.CreateOrUpdateConsumer(ctx, proto.EventStream, jetstream.ConsumerConfig{
		// No filter: whatever the stream holds is applied or terminated, never left behind.
		Durable:       proto.EventConsumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 20_000,
		MaxDeliver:    -1,
	})
	if err != nil {
		return fmt.Errorf("create consumer %s: %w", proto.EventConsumer, err)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(512), jetstream.PullHeartbeat(b.cfg.ConsumerHeartbeat),
		jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		return fmt.Errorf("consume events: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	next := make(chan delivery)
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		for {
			msg, err := it.Next()
			select {
			case next <- delivery{msg, err}:
			case <-stopped:
				return
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
		}
	}()
	// Applied events are acked in batches: a batch ends when no event is waiting, or at ackBatch.
	// Before the acks, the output the batch wrote must be in the output stream (SetOutput).
	var batch []jetstream.Msg
	defer func() { b.ackAll(batch) }()
	for {
		var d delivery
		if len(batch) == 0 {
			d = <-next
		} else {
			select {
			case d = <-next:
			default:
				batch = b.ackAll(batch)
				continue
			}
		}
		msg, err := d.msg, d.err
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, jetstream.ErrConsumerDeleted), errors.Is(err, jetstream.ErrConsumerNotFound):
			return fmt.Errorf("%w: %v", ErrConsumerGone, err)
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			return fmt.Errorf("consume events: %w", err)
		case errors.Is(err, jetstream.ErrNoHeartbeat):
			// The server stopped answering pulls: a lost link (the iterator pulls again once it is
			// back), or the consumer deleted while no pull was waiting, which only asking tells.
			if _, ierr := cons.Info(ctx); errors.Is(ierr, jetstream.ErrConsumerNotFound) {
				return fmt.Errorf("%w: %v", ErrConsumerGone, ierr)
			}
			b.cfg.Logger.Warn("event stream", "err", err)
		case err != nil:
			b.cfg.Logger.Warn("event stream", "err", err)
		case b.apply(ctx, h, msg):
			if batch = append(batch, msg); len(batch) >= ackBatch {
				batch = b.ackAll(batch)
			}
		}
	}
}

// heartbeat gives h a runner's heartbeat that came on subject, unless it does not decode, names
// another runner or pool than its subject, or a pool past the runner's MaxPoolsPerRunner. It makes
// sure the work consumers of the runner's pool exist: runners bind to them but may not create them.
func (b *Bus) heartbeat(ctx context.Context, h Handler, subject string, data []byte) {
	hb, err := proto.DecodeHeartbeat(data)
	if err != nil {
		b.cfg.Logger.Warn("bad heartbeat", "subject", subject, "err", err)
		return
	}
	if from, pool, _ := proto.ParseHeartbeatSubject(subject); from != hb.Runner || pool != hb.Pool {
		err := h.Forged(coordinator.ForgedHeartbeat, fmt.Sprintf("a heartbeat on %s names runner %s of pool %s", subject, hb.Runner, hb.Pool))
		b.cfg.Logger.Error("dropping forged heartbeat", "subject", subject, "err", err)
		return
	}
	if !b.pools.name(hb.Runner, hb.Pool, time.Now()) {
		err := h.Forged(coordinator.ForgedHeartbeat, fmt.Sprintf("runner %s named pool %s past its %d pools", hb.Runner, hb.Pool, b.cfg.MaxPoolsPerRunner))
		b.cfg.Logger.Error("dropping heartbeat of a pool too many", "subject", subject, "err", err)
		return
	}
	b.ensureWork(ctx, hb.Pool, hb.Readonly)
	h.HandleHeartbeat(domainHeartbeat(hb))
}

// delivery is one result of the event iterator.
type delivery struct {
	msg jetstream.Msg
	err error
}

// ackBatch is the most events applied before their acks.
const ackBatch = 256

// SetOutput makes Consume wait, before it acks events, for o to have stored the output they carried
// (Output.Flush). Call it before Consume.
func (b *Bus) SetOutput(o *Output) { b.output = o }

// ackAll acks the applied events of batch once their output is stored; when it cannot be, they are
// redelivered and applied again. It returns batch emptied.
func (b *Bus) ackAll(batch []jetstream.Msg) []jetstream.Msg {
	if len(batch) == 0 {
		return batch
	}
	if b.output != nil {
		ctx, cancel := context.WithTimeout(context.Background(), outputAckWait)
		err := b.output.Flush(ctx)
		cancel()
		if err != nil {
			b.cfg.Logger.Error("output not stored: its events are applied again", "events", len(batch), "err", err)
			for _, msg := range batch {
				if err := msg.NakWithDelay(time.Second); err != nil {
					b.cfg.Logger.Warn("nak event", "subject", msg.Subject(), "err", err)
				}
			}
			clear(batch)
			return batch[:0]
		}
	}
	for _, msg := range batch {
		if err := msg.Ack(); err != nil {
			b.cfg.Logger.Warn("ack event", "subject", msg.Subject(), "err", err)
		}
	}
	clear(batch)
	return batch[:0]
}

// apply hands one message to h and naks or terminates it, or reports that it is to be acked.
func (b *Bus) apply(ctx context.Context, h Handler, msg jetstream.Msg) bool {
	from, job, kind, ok := proto.ParseEventSubject(msg.Subject())
	var err error
	switch {
	case !ok:
		err = fmt.Errorf("%w: subject %s", proto.ErrInvalid, msg.Subject())
	case kind == proto.KindOutput:
		var c *proto.Chunk
		if c, err = proto.DecodeChunk(msg.Subject(), msg.Headers(), msg.Data()); err == nil {
			err = h.HandleChunk(ctx, domainChunk(c))
		}
	default:
		var e *proto.Event
		e, err = proto.DecodeEvent(msg.Data())
		switch {
		case err != nil:
		case e.Runner != from || e.JobID != job:
			err = h.Forged(coordinator.ForgedState, fmt.Sprintf("an event of job %s from runner %s on %s", e.JobID, e.Runner, msg.Subject()))
		default:
			err = h.HandleEvent(ctx, domainEvent(e))
		}
	}
	switch {
	case err == nil:
		return true
	case errors.Is(err, proto.ErrInvalid):
		b.cfg.Logger.Error("dropping undecodable event", "subject", msg.Subject(), "err", err)
		err = msg.Term()
	case errors.Is(err, coordinator.ErrForged):
		b.cfg.Logger.Error("dropping forged event", "subject", msg.Subject(), "err", err)
		err = msg.Term()
	case errors.Is(err, coordinator.ErrNotReady):
		err = msg.NakWithDelay(50 * time.Millisecond)
	default:
		b.cfg.Logger.Error("apply event", "subject", msg.Subject(), "err", err)
		err = msg.NakWithDelay(time.Second)
	}
	if err != nil {
		b.cfg.Logger.Warn("ack event", "subject", msg.Subject(), "err", err)
	}
	return false
}
