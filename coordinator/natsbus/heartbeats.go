package natsbus

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sbx-dev/sbx/proto"
)

// maxHeardRunners bounds the runners a Heartbeats remembers: one heartbeat each, the last.
const maxHeardRunners = 10_000

// Heartbeats remembers the last heartbeat of every runner heard within maxAge, on every
// coordinator, leading or not. A coordinator that takes the lead hands them to its new service
// (Bus.Replay), which so knows the runners at once instead of a heartbeat interval later: until it
// does, /readyz says no runner is connected and a readonly start is refused.
type Heartbeats struct {
	maxAge time.Duration
	sub    *nats.Subscription

	mu   sync.Mutex
	last map[string]heardBeat // by runner
}

// heardBeat is a heartbeat as it came, checked again when it is replayed.
type heardBeat struct {
	subject string
	data    []byte
	at      time.Time
}

// WatchHeartbeats subscribes to every runner's heartbeats on nc until Stop.
func WatchHeartbeats(nc *nats.Conn, maxAge time.Duration) (*Heartbeats, error) {
	h := &Heartbeats{maxAge: maxAge, last: map[string]heardBeat{}}
	sub, err := nc.Subscribe(proto.HeartbeatSubjects, h.hear)
	if err != nil {
		return nil, fmt.Errorf("subscribe heartbeats: %w", err)
	}
	h.sub = sub
	return h, nil
}

// Stop ends the subscription.
func (h *Heartbeats) Stop() { _ = h.sub.Unsubscribe() }

// hear keeps m as its runner's last heartbeat. The runner is the subject's: under NATS auth only
// that runner may publish there, so one runner holds one entry however it names its pools.
func (h *Heartbeats) hear(m *nats.Msg) {
	runner, _, ok := proto.ParseHeartbeatSubject(m.Subject)
	if !ok {
		return
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, known := h.last[runner]; !known && len(h.last) >= maxHeardRunners {
		h.dropOldLocked(now)
		if len(h.last) >= maxHeardRunners {
			return
		}
	}
	h.last[runner] = heardBeat{subject: m.Subject, data: m.Data, at: now}
}

// dropOldLocked forgets the heartbeats older than maxAge; h.mu is held.
func (h *Heartbeats) dropOldLocked(now time.Time) {
	for runner, b := range h.last {
		if now.Sub(b.at) > h.maxAge {
			delete(h.last, runner)
		}
	}
}

// recent returns the heartbeats heard within maxAge.
func (h *Heartbeats) recent() []heardBeat {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropOldLocked(time.Now())
	out := make([]heardBeat, 0, len(h.last))
	for _, b := range h.last {
		out = append(out, b)
	}
	return out
}

// Replay feeds the heartbeats hb heard recently to h, each checked as Consume checks one that
// arrives (heartbeat): call it after h is made and before it serves. Each counts as heard now, as
// every deadline of a new leader counts from its start.
func (b *Bus) Replay(ctx context.Context, h Handler, hb *Heartbeats) {
	for _, beat := range hb.recent() {
		b.heartbeat(ctx, h, beat.subject, beat.data)
	}
}
