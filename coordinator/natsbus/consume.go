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
	// ConfirmStart reports whether the job is queued and may start (see proto.Work.NotAfter).
	ConfirmStart(id string) bool
}

// Consume feeds every event of the event stream and every heartbeat to h, and answers the runners'
// start confirmations, until ctx ends. An event is acked only after h stored it; one h cannot place
// yet is redelivered shortly; one that does not decode is logged and terminated.
func (b *Bus) Consume(ctx context.Context, h Handler) error {
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

	sub, err := b.nc.Subscribe(proto.HeartbeatSubjects, func(m *nats.Msg) {
		hb, err := proto.DecodeHeartbeat(m.Data)
		if err != nil {
			b.cfg.Logger.Warn("bad heartbeat", "subject", m.Subject, "err", err)
			return
		}
		h.HandleHeartbeat(hb)
	})
	if err != nil {
		return fmt.Errorf("subscribe heartbeats: %w", err)
	}
	defer sub.Unsubscribe()

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
	it, err := cons.Messages(jetstream.PullMaxMessages(512))
	if err != nil {
		return fmt.Errorf("consume events: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		msg, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return nil
		}
		if err != nil {
			b.cfg.Logger.Warn("event stream", "err", err)
			continue
		}
		b.apply(ctx, h, msg)
	}
}

// apply hands one message to h and acks, naks or terminates it.
func (b *Bus) apply(ctx context.Context, h Handler, msg jetstream.Msg) {
	_, kind, ok := proto.JobFromSubject(msg.Subject())
	var err error
	switch {
	case !ok:
		err = fmt.Errorf("%w: subject %s", proto.ErrInvalid, msg.Subject())
	case kind == "out":
		var c *proto.Chunk
		if c, err = proto.DecodeChunk(msg.Subject(), msg.Headers(), msg.Data()); err == nil {
			err = h.HandleChunk(ctx, c)
		}
	default:
		var e *proto.Event
		if e, err = proto.DecodeEvent(msg.Data()); err == nil {
			err = h.HandleEvent(ctx, e)
		}
	}
	switch {
	case err == nil:
		err = msg.Ack()
	case errors.Is(err, proto.ErrInvalid):
		b.cfg.Logger.Error("dropping undecodable event", "subject", msg.Subject(), "err", err)
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
