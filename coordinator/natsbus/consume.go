package natsbus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/proto"
)

// Handler applies what the runners report. *coordinator.Service implements it.
type Handler interface {
	HandleEvent(ctx context.Context, e *proto.Event) error
	HandleChunk(ctx context.Context, c *proto.Chunk) error
	HandleHeartbeat(h *proto.Heartbeat)
	// Forged counts a message of a kind (coordinator.ForgedState...) dropped as forged and returns
	// coordinator.ErrForged wrapped with why.
	Forged(kind, why string) error
	// ConfirmStart reports whether the job is queued and may start (see proto.Work.NotAfter).
	ConfirmStart(id string) bool
}

// ErrConsumerGone is returned by Consume when the coordinator's event consumer was deleted under it.
var ErrConsumerGone = errors.New("natsbus: the event consumer is gone")

// Consume feeds every event of the event stream and every heartbeat to h, and answers the runners'
// start confirmations (proto.ConfirmSubject), until ctx ends. An event is
// acked only after h stored it; one h cannot place yet is redelivered shortly; one that does not
// decode, or is forged, is logged and terminated. A heartbeat counts only from the runner its subject
// names (with NATS auth, the one that published it). Each heartbeat also makes sure the work
// consumers of the runner's pool exist: runners bind to them but may not create them. Consume returns
// an error when the event consumer is deleted or its iterator stops while ctx lives.
func (b *Bus) Consume(ctx context.Context, h Handler) error {
	sub, err := b.nc.Subscribe(proto.HeartbeatSubjects, func(m *nats.Msg) {
		hb, err := proto.DecodeHeartbeat(m.Data)
		if err != nil {
			b.cfg.Logger.Warn("bad heartbeat", "subject", m.Subject, "err", err)
			return
		}
		if from, _ := proto.RunnerFromHeartbeat(m.Subject); from != hb.Runner {
			err := h.Forged(coordinator.ForgedHeartbeat, fmt.Sprintf("a heartbeat on %s names runner %s", m.Subject, hb.Runner))
			b.cfg.Logger.Error("dropping forged heartbeat", "subject", m.Subject, "err", err)
			return
		}
		b.ensureWork(ctx, hb.Pool, hb.Readonly)
		h.HandleHeartbeat(hb)
	})
	if err != nil {
		return fmt.Errorf("subscribe heartbeats: %w", err)
	}
	defer sub.Unsubscribe()
	confirm, err := b.nc.Subscribe(proto.ConfirmSubject, func(m *nats.Msg) {
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

	// The deliveries a crashed coordinator left unacked would wait out their AckWait (30 s) before
	// being delivered again, holding jobs `running` after their exit. There is one coordinator: at its
	// start nothing else consumes, so the consumer is made anew and delivers at once everything still
	// in the (work-queue) stream, acked events being gone from it. Applying an event twice is harmless.
	if err := b.js.DeleteConsumer(ctx, proto.EventStream, proto.EventConsumer); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("reset consumer %s: %w", proto.EventConsumer, err)
	}
	cons, err := b.js.CreateOrUpdateConsumer(ctx, proto.EventStream, jetstream.ConsumerConfig{
		Durable:       proto.EventConsumer,
		FilterSubject: proto.EventSubjects,
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
	for {
		msg, err := it.Next()
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
		default:
			b.apply(ctx, h, msg)
		}
	}
}

// apply hands one message to h and acks, naks or terminates it.
func (b *Bus) apply(ctx context.Context, h Handler, msg jetstream.Msg) {
	from, job, kind, ok := proto.ParseEventSubject(msg.Subject())
	var err error
	switch {
	case !ok:
		err = fmt.Errorf("%w: subject %s", proto.ErrInvalid, msg.Subject())
	case kind == proto.KindOutput:
		var c *proto.Chunk
		if c, err = proto.DecodeChunk(msg.Subject(), msg.Headers(), msg.Data()); err == nil {
			err = h.HandleChunk(ctx, c)
		}
	default:
		var e *proto.Event
		e, err = proto.DecodeEvent(msg.Data())
		switch {
		case err != nil:
		case e.Runner != from || e.JobID != job:
			err = h.Forged(coordinator.ForgedState, fmt.Sprintf("an event of job %s from runner %s on %s", e.JobID, e.Runner, msg.Subject()))
		default:
			err = h.HandleEvent(ctx, e)
		}
	}
	switch {
	case err == nil:
		err = msg.Ack()
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
}
