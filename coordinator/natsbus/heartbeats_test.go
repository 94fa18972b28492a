package natsbus

import (
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
)

// TestReplayHeartbeats: heartbeats heard before a service existed (a standby's, before it takes
// the lead) make it know their runners at once when replayed, checked as live ones are: a forged
// one is dropped and counted, and one older than the deadline is forgotten.
func TestReplayHeartbeats(t *testing.T) {
	nc := natstest.Conn(t)
	heard, err := WatchHeartbeats(nc, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer heard.Stop()
	stale, err := WatchHeartbeats(nc, time.Nanosecond)
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Stop()
	honest := &proto.Heartbeat{V: proto.Version, Runner: "r2", Pool: "default", Slots: 1, Readonly: true, Boot: time.Now(), Time: time.Now()}
	forged := *honest
	forged.Runner = "victim"
	for subject, hb := range map[string]*proto.Heartbeat{proto.HeartbeatSubject("r2", "default"): honest, proto.HeartbeatSubject("r3", "default"): &forged} {
		if err := nc.Publish(subject, proto.Encode(hb)); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 5*time.Second, "both heartbeats heard", func() bool {
		stale.mu.Lock()
		defer stale.mu.Unlock()
		return len(stale.last) == 2 && len(heard.recent()) == 2
	})

	// The heartbeats came before this service's consumer subscribed: it knows no runner yet.
	c := startCoordinator(t, nc, t.TempDir())
	if rs := c.svc.Runners(); len(rs) != 0 {
		t.Fatalf("runners before the replay: %+v, want none", rs)
	}
	c.bus.Replay(t.Context(), c.svc, stale)
	if rs := c.svc.Runners(); len(rs) != 0 {
		t.Fatalf("runners after replaying heartbeats past their age: %+v, want none", rs)
	}
	c.bus.Replay(t.Context(), c.svc, heard)
	if rs := c.svc.Runners(); len(rs) != 1 || rs[0].ID != "r2" || !rs[0].Readonly {
		t.Fatalf("runners after the replay: %+v, want r2 (readonly) alone", rs)
	}
	if n := c.svc.Stats().Forged[coordinator.ForgedHeartbeat]; n != 1 {
		t.Fatalf("forged heartbeats counted: %d, want 1", n)
	}
}
