package natsbus

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/internal/jsready"
	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
)

// TestReplicasSurviveLeaderLoss: on a cluster of three, a bus with 3 replicas makes both streams
// with 3 replicas, and once the server leading the work stream shuts down, a dispatch succeeds
// again and the work queued before is all still there.
func TestReplicasSurviveLeaderLoss(t *testing.T) {
	cluster := natstest.StartCluster(t, 3)
	// As the coordinator's connection (cmd/sbx coordinatorConn): no reconnect buffer, so a dispatch
	// while the link moves to another server fails rather than waits.
	nc := natstest.Connect(t, cluster.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.ReconnectBufSize(-1))
	ctx := t.Context()
	work := func(id string) *coordinator.Work {
		return &coordinator.Work{JobID: id, Command: "true", Cwd: "/", Pool: "default", Claim: "0123456789abcdef"}
	}
	bus, err := New(ctx, nc, Config{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	queued := map[uint64]string{}
	for _, id := range []string{"w1", "w2"} {
		seq, err := bus.Dispatch(ctx, work(id))
		if err != nil {
			t.Fatal(err)
		}
		queued[seq] = id
	}
	for _, s := range []jetstream.Stream{bus.work, bus.events} {
		waitReplicas(t, s, 3)
	}

	leader := cluster.ShutdownLeader(t, bus.work)

	// Each attempt is a new job, as each start the coordinator refuses is: a failed dispatch
	// withdraws its work (settle), and the stream would take the same id again as a duplicate of
	// the withdrawn one.
	deadline := time.Now().Add(30 * time.Second)
	var seq uint64
	var id string
	for attempt := 1; ; attempt++ {
		id = fmt.Sprintf("w3-%d", attempt)
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		seq, err = bus.Dispatch(dctx, work(id))
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no dispatch succeeded within 30s of the loss of %s: %v", leader.Name(), err)
		}
		time.Sleep(100 * time.Millisecond) // between attempts, each a job, while a new leader is elected
	}
	queued[seq] = id
	info, err := bus.work.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Cluster.Leader == leader.Name() {
		t.Fatalf("after the loss of %s the work stream's leader is still %s", leader.Name(), info.Cluster.Leader)
	}
	for seq, id := range queued {
		msg, err := bus.work.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("work %s (seq %d): %v", id, seq, err)
		}
		w, err := proto.DecodeWork(msg.Data)
		if err != nil || w.JobID != id {
			t.Fatalf("seq %d holds %v (%v), want %s", seq, w, err, id)
		}
	}
}

// waitReplicas waits until stream s has n replicas, all current: only then does the loss of one
// server keep everything it holds.
func waitReplicas(t *testing.T, s jetstream.Stream, n int) {
	t.Helper()
	var info *jetstream.StreamInfo
	var err error
	if !poll.Within(30*time.Second, func() bool {
		info, err = s.Info(t.Context())
		return err == nil && info.Config.Replicas == n && info.Cluster != nil && info.Cluster.Leader != "" && len(info.Cluster.Replicas) == n-1 && allCurrent(info.Cluster.Replicas)
	}) {
		t.Fatalf("stream %s did not get %d current replicas: %+v, %v", s.CachedInfo().Config.Name, n, info, err)
	}
}

func allCurrent(peers []*jetstream.PeerInfo) bool {
	for _, p := range peers {
		if !p.Current {
			return false
		}
	}
	return true
}

// TestReplicasNeedServers: replicas above what NATS can hold are refused with an error naming the
// stream and the cause, not as NotReady (no wait helps): on a single server, on a cluster of fewer
// servers, and on streams made with another count.
func TestReplicasNeedServers(t *testing.T) {
	t.Run("single server", func(t *testing.T) {
		nc := natstest.Conn(t)
		_, err := New(t.Context(), nc, Config{Replicas: 3})
		if err == nil || jsready.NotReady(err) || !strings.Contains(err.Error(), proto.WorkStream) || !strings.Contains(err.Error(), "not a cluster") {
			t.Fatalf("New with 3 replicas on one server: %v (not ready: %v); want a refusal naming %s and the missing cluster", err, jsready.NotReady(err), proto.WorkStream)
		}
	})
	t.Run("existing stream", func(t *testing.T) {
		nc := natstest.Conn(t)
		if _, err := New(t.Context(), nc, Config{}); err != nil {
			t.Fatal(err)
		}
		_, err := New(t.Context(), nc, Config{Replicas: 3})
		if err == nil || jsready.NotReady(err) || !strings.Contains(err.Error(), "stream "+proto.WorkStream+" has 1 replicas, not 3") {
			t.Fatalf("New with 3 replicas on streams of 1: %v; want a refusal naming %s and both counts", err, proto.WorkStream)
		}
	})
	t.Run("small cluster", func(t *testing.T) {
		cluster := natstest.StartCluster(t, 3)
		nc := natstest.Connect(t, cluster.URLs())
		_, err := New(t.Context(), nc, Config{Replicas: 5})
		if err == nil || jsready.NotReady(err) || !strings.Contains(err.Error(), proto.WorkStream) || !strings.Contains(err.Error(), "fewer than 5 JetStream servers") {
			t.Fatalf("New with 5 replicas on 3 servers: %v (not ready: %v); want a refusal naming %s and the missing servers", err, jsready.NotReady(err), proto.WorkStream)
		}
	})
}
