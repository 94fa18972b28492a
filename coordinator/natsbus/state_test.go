package natsbus

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/store"
	"github.com/sbx-dev/sbx/internal/jsready"
	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/proto"
)

func openCache(t *testing.T) *store.DB {
	t.Helper()
	db, err := store.Open(filepath.Join(t.TempDir(), "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// openState opens a State over a new empty cache and syncs it.
func openState(t *testing.T, nc *nats.Conn, cache StateCache) *State {
	t.Helper()
	st, err := OpenState(t.Context(), nc, cache, StateConfig{RetainAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	return st
}

func stateJob(id, session string, status coordinator.Status) *coordinator.Job {
	code := 0
	j := &coordinator.Job{
		ID: id, Session: session, Title: "t " + id, Command: "echo " + id, Cwd: "/", Pool: "default", Status: status,
		CreatedAt: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC), Claim: "0123456789abcdef", Ports: []coordinator.Port{{Address: "::1", Port: 8080}},
	}
	if status.Ended() {
		end := j.CreatedAt.Add(time.Second)
		j.EndedAt, j.ExitCode, j.OutputBytes = &end, &code, 12
	}
	return j
}

func stateNote(id, session string, created time.Time) *coordinator.Notification {
	return &coordinator.Notification{ID: id, Session: session, Kind: coordinator.KindFinished, Status: "succeeded", JobID: id, Text: "<done " + id + ">", CreatedAt: created}
}

// snapshot is everything a Store shows, as JSON, to compare two stores.
func snapshot(t *testing.T, s coordinator.Store) string {
	t.Helper()
	ctx := t.Context()
	jobs, err := s.Jobs(ctx, coordinator.JobFilter{})
	if err != nil {
		t.Fatal(err)
	}
	unfinished, err := s.UnfinishedJobs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sessions, err := s.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(sessions, func(a, b *coordinator.Session) int { return strings.Compare(a.ID, b.ID) })
	var b strings.Builder
	for _, v := range []any{jobs, unfinished} {
		data, _ := json.Marshal(v)
		fmt.Fprintf(&b, "%s\n", data)
	}
	for _, st := range sessions {
		notes, err := s.Notifications(ctx, st.ID, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := json.Marshal(st)
		fmt.Fprintf(&b, "session %s last %d\n", data, st.LastSeq)
		for _, n := range notes {
			data, _ := json.Marshal(n)
			fmt.Fprintf(&b, "  %s\n", data)
		}
	}
	return b.String()
}

// TestStateSync: what goes through a State comes back, the same, from the buckets into a new empty
// cache (another coordinator's, or one whose disk was lost): jobs, sessions with their last seq,
// notifications with their seqs; new notifications continue each session's seqs, even one whose
// notifications were all removed; a cache holding something else is made equal to the buckets.
func TestStateSync(t *testing.T) {
	nc := natstest.Conn(t)
	ctx := t.Context()
	a := openState(t, nc, openCache(t))
	old := time.Now().Add(-2 * time.Hour)
	for _, j := range []*coordinator.Job{stateJob("job1", "s1", coordinator.StatusRunning), stateJob("job2", "s1", coordinator.StatusSucceeded), stateJob("job3", "s2", coordinator.StatusQueued)} {
		if err := a.PutJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []*coordinator.Session{{ID: "s1", Acked: 1, Format: coordinator.FormatTask}, {ID: "s2", LeaseMS: 60000}} {
		if err := a.PutSession(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	notes := []*coordinator.Notification{stateNote("n1", "s1", old), stateNote("n2", "s1", time.Now()), stateNote("n3", "s2", old)}
	if err := a.AddNotifications(ctx, notes); err != nil {
		t.Fatal(err)
	}
	again := stateNote("n2", "s1", time.Now())
	if err := a.AddNotifications(ctx, []*coordinator.Notification{again}); err != nil || again.Seq != 2 {
		t.Fatalf("adding n2 again: %v, seq %d; want its seq 2", err, again.Seq)
	}
	// Retention: job2 and the notifications of two hours ago go, from the buckets as well.
	if err := a.DeleteJobs(ctx, []string{"job2"}); err != nil {
		t.Fatal(err)
	}
	if n, err := a.DeleteNotificationsBefore(ctx, time.Now().Add(-time.Hour)); err != nil || n != 2 {
		t.Fatalf("DeleteNotificationsBefore = %d, %v; want 2", n, err)
	}
	want := snapshot(t, a)
	for _, w := range []string{`"id":"job1"`, `"id":"job3"`, `"id":"s1"`, `last 2`, `"id":"n2"`, `"id":"s2"`, `last 1`} {
		if !strings.Contains(want, w) {
			t.Fatalf("the state lacks %s:\n%s", w, want)
		}
	}
	if strings.Contains(want, "job2") || strings.Contains(want, `"id":"n1"`) || strings.Contains(want, `"id":"n3"`) {
		t.Fatalf("the state still has what retention removed:\n%s", want)
	}

	b := openState(t, nc, openCache(t))
	if got := snapshot(t, b); got != want {
		t.Fatalf("after Sync into an empty cache:\n%s\nwant:\n%s", got, want)
	}
	next := []*coordinator.Notification{stateNote("n4", "s1", time.Now()), stateNote("n5", "s2", time.Now())}
	if err := b.AddNotifications(ctx, next); err != nil {
		t.Fatal(err)
	}
	if next[0].Seq != 3 || next[1].Seq != 2 {
		t.Fatalf("new notifications after Sync have seqs %d, %d; want 3, 2", next[0].Seq, next[1].Seq)
	}

	// a's cache has a job the buckets lack (written behind the State's back) and lacks n4, n5.
	stale := a.cache
	if err := stale.PutJob(ctx, stateJob("stray", "s1", coordinator.StatusRunning)); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := snapshot(t, a), snapshot(t, b); got != want {
		t.Fatalf("after Sync of a stale cache:\n%s\nwant:\n%s", got, want)
	}
}

// TestStateMigrates: a data dir written before the state moved to JetStream (everything in sbx.db)
// is uploaded into empty buckets, once: a new cache synced from them holds the same, and a second
// coordinator's data dir of that age is not uploaded over it.
func TestStateMigrates(t *testing.T) {
	nc := natstest.Conn(t)
	ctx := t.Context()
	old := openCache(t)
	for _, j := range []*coordinator.Job{stateJob("job1", "s1", coordinator.StatusSucceeded), stateJob("job2", "s1", coordinator.StatusRunning)} {
		if err := old.PutJob(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	if err := old.PutSession(ctx, &coordinator.Session{ID: "s1", Acked: 2}); err != nil {
		t.Fatal(err)
	}
	long := time.Now().Add(-48 * time.Hour)
	if err := old.AddNotifications(ctx, []*coordinator.Notification{stateNote("n1", "s1", long), stateNote("n2", "s1", long), stateNote("n3", "s1", time.Now())}); err != nil {
		t.Fatal(err)
	}
	// Retention removed the first two; the last seq stays 3.
	if _, err := old.DeleteNotificationsBefore(ctx, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	want := snapshot(t, old)
	if !strings.Contains(want, "last 3") {
		t.Fatalf("the old data dir:\n%s\nwant session s1 at last seq 3", want)
	}

	openState(t, nc, old)
	if got := snapshot(t, old); got != want {
		t.Fatalf("the data dir after its upload and Sync:\n%s\nwant:\n%s", got, want)
	}
	fresh := openState(t, nc, openCache(t))
	if got := snapshot(t, fresh); got != want {
		t.Fatalf("a new cache synced from the uploaded buckets:\n%s\nwant:\n%s", got, want)
	}
	n := stateNote("n4", "s1", time.Now())
	if err := fresh.AddNotifications(ctx, []*coordinator.Notification{n}); err != nil || n.Seq != 4 {
		t.Fatalf("the next notification: %v, seq %d; want seq 4", err, n.Seq)
	}

	other := openCache(t)
	if err := other.PutJob(ctx, stateJob("elsewhere", "s9", coordinator.StatusSucceeded)); err != nil {
		t.Fatal(err)
	}
	openState(t, nc, other)
	if got := snapshot(t, other); strings.Contains(got, "elsewhere") || !strings.Contains(got, `"id":"n4"`) {
		t.Fatalf("a second old data dir was uploaded over the state, or not replaced by it:\n%s", got)
	}
}

// TestStateReplicas: buckets made with one count are refused with another, naming the bucket's
// stream, not waited for.
func TestStateReplicas(t *testing.T) {
	nc := natstest.Conn(t)
	openState(t, nc, openCache(t))
	_, err := OpenState(t.Context(), nc, openCache(t), StateConfig{Replicas: 3})
	if err == nil || jsready.NotReady(err) || !strings.Contains(err.Error(), "stream KV_"+StateBucket+" has 1 replicas, not 3") {
		t.Fatalf("OpenState with 3 replicas over buckets of 1: %v; want a refusal naming KV_%s", err, StateBucket)
	}
}

// TestStateWritesFailCleanly: with NATS gone, every write fails, unavailable (the API's 503), and
// leaves the cache as it was.
func TestStateWritesFailCleanly(t *testing.T) {
	ns := natstest.Server(t)
	// As the coordinator connects (cmd/sbx coordinatorConn): nothing is buffered while disconnected.
	nc := natstest.Connect(t, ns.ClientURL(), nats.ReconnectBufSize(-1))
	ctx := t.Context()
	s := openState(t, nc, openCache(t))
	if err := s.PutJob(ctx, stateJob("job1", "s1", coordinator.StatusSucceeded)); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSession(ctx, &coordinator.Session{ID: "s1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddNotifications(ctx, []*coordinator.Notification{stateNote("n1", "s1", time.Now().Add(-2*time.Hour))}); err != nil {
		t.Fatal(err)
	}
	want := snapshot(t, s)

	ns.Shutdown()
	ns.WaitForShutdown()
	write := func(name string, f func(context.Context) error) {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := f(wctx); coordinator.ErrorCode(err) != coordinator.EUNAVAILABLE {
			t.Errorf("%s with NATS down: %v; want an error coded %s (a 503)", name, err, coordinator.EUNAVAILABLE)
		}
		if got := snapshot(t, s); got != want {
			t.Errorf("after a failed %s the cache is:\n%s\nwant:\n%s", name, got, want)
		}
	}
	write("PutJob", func(ctx context.Context) error {
		return s.PutJob(ctx, stateJob("job2", "s1", coordinator.StatusRunning))
	})
	write("PutSession", func(ctx context.Context) error { return s.PutSession(ctx, &coordinator.Session{ID: "s1", Acked: 1}) })
	write("AddNotifications", func(ctx context.Context) error {
		return s.AddNotifications(ctx, []*coordinator.Notification{stateNote("n2", "s1", time.Now()), stateNote("n3", "s2", time.Now())})
	})
	write("DeleteJobs", func(ctx context.Context) error { return s.DeleteJobs(ctx, []string{"job1"}) })
	write("DeleteNotificationsBefore", func(ctx context.Context) error {
		_, err := s.DeleteNotificationsBefore(ctx, time.Now().Add(-time.Hour))
		return err
	})
}

// TestStateLargestJob: the largest job the API lets through, every string at its bound and made of
// characters JSON escapes to six bytes, fits in the default max_payload (1 MiB) and is stored; a
// job past it is refused with an error that says so, and the cache does not keep it.
func TestStateLargestJob(t *testing.T) {
	nc := natstest.Conn(t)
	ctx := t.Context()
	s := openState(t, nc, openCache(t))
	fat := func(n int) string { return strings.Repeat("<", n) }
	j := stateJob("big", "s1", coordinator.StatusFailed)
	j.Command, j.Title, j.Cwd, j.Error = fat(proto.MaxCommandBytes), fat(proto.MaxTitleBytes), "/"+fat(proto.MaxPathBytes-1), fat(4096)
	j.Source = &coordinator.Source{WS: fat(proto.MaxPathBytes)}
	j.Notify = &coordinator.OutputNotify{Pattern: fat(coordinator.MaxNotifyPattern), Reason: fat(coordinator.MaxNotifyReason), DebounceMS: 1}
	j.ToolCallID, j.User = fat(coordinator.MaxToolCallID), fat(proto.MaxUserBytes)
	for i := range proto.MaxPorts {
		j.Ports = append(j.Ports, coordinator.Port{Address: "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255", Port: 65535 - i})
	}
	data, _ := json.Marshal(j)
	if len(data) > 1<<20 {
		t.Fatalf("the largest job encodes to %d bytes, more than NATS's default max_payload", len(data))
	}
	t.Logf("the largest job encodes to %d bytes", len(data))
	if err := s.PutJob(ctx, j); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Job(ctx, "big"); err != nil || got.Command != j.Command {
		t.Fatalf("Job(big) = %v; want it stored", err)
	}

	huge := stateJob("huge", "s1", coordinator.StatusRunning)
	huge.Command = fat(int(nc.MaxPayload()))
	err := s.PutJob(ctx, huge)
	if err == nil || !strings.Contains(err.Error(), "job huge") || !strings.Contains(err.Error(), "max_payload") {
		t.Fatalf("PutJob of a job past max_payload: %v; want an error naming the job and max_payload", err)
	}
	if _, err := s.Job(ctx, "huge"); coordinator.ErrorCode(err) != coordinator.ENOTFOUND {
		t.Fatalf("the refused job is in the cache: %v", err)
	}
}

// TestStateSeqBeforeNotes: a session's last seq is written before its notifications, so a write that
// stops between the two (here a notification past max_payload; in life a crash) leaves a seq unused,
// never one given twice: a cache synced afterwards continues after it, and the cache of the failed
// write, left as it was, gives the same seq to the next notification.
func TestStateSeqBeforeNotes(t *testing.T) {
	nc := natstest.Conn(t)
	ctx := t.Context()
	s := openState(t, nc, openCache(t))
	if err := s.AddNotifications(ctx, []*coordinator.Notification{stateNote("n1", "s1", time.Now())}); err != nil {
		t.Fatal(err)
	}
	big := stateNote("n2", "s1", time.Now())
	big.Text = strings.Repeat("x", int(nc.MaxPayload()))
	if err := s.AddNotifications(ctx, []*coordinator.Notification{big}); err == nil || !strings.Contains(err.Error(), "notification n2") {
		t.Fatalf("AddNotifications past max_payload: %v; want an error naming the notification", err)
	}
	synced := openState(t, nc, openCache(t))
	n := stateNote("n3", "s1", time.Now())
	if err := synced.AddNotifications(ctx, []*coordinator.Notification{n}); err != nil || n.Seq != 3 {
		t.Fatalf("after Sync, the next notification: %v, seq %d; want seq 3 (2 was taken when the write stopped)", err, n.Seq)
	}
	if sessions, _ := s.Sessions(ctx); len(sessions) != 1 || sessions[0].LastSeq != 1 {
		t.Fatalf("the failed write's cache has sessions %+v; want s1 at last seq 1", sessions)
	}
}

// TestStateReplicasSurviveLeaderLoss: on a cluster of three, buckets of 3 replicas lose nothing when
// the server leading the state bucket shuts down: writes go on once a new leader is elected, and a
// new cache synced from the survivors equals the writer's. With a second server gone, writes are
// refused as unavailable and reads go on from the cache.
func TestStateReplicasSurviveLeaderLoss(t *testing.T) {
	cluster := natstest.StartCluster(t, 3)
	nc := natstest.Connect(t, cluster.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.ReconnectBufSize(-1))
	ctx := t.Context()
	s, err := OpenState(ctx, nc, openCache(t), StateConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	waitReplicas(t, s.stateStream, 3)
	waitReplicas(t, s.notesStream, 3)
	if err := s.PutJob(ctx, stateJob("job1", "s1", coordinator.StatusRunning)); err != nil {
		t.Fatal(err)
	}
	if err := s.AddNotifications(ctx, []*coordinator.Notification{stateNote("n1", "s1", time.Now())}); err != nil {
		t.Fatal(err)
	}

	leader := cluster.ShutdownLeader(t, s.stateStream)
	// A write whose outcome is unknown is written again, as the service's retry would: the same
	// value at the same key, the same seq.
	retry := func(what string, write func(context.Context) error) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; {
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := write(wctx)
			cancel()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s failed for 30 s after the loss of %s: %v", what, leader.Name(), err)
			}
			time.Sleep(100 * time.Millisecond) // between attempts, while a new leader is elected
		}
	}
	retry("PutJob", func(ctx context.Context) error {
		return s.PutJob(ctx, stateJob("job2", "s1", coordinator.StatusQueued))
	})
	n2 := stateNote("n2", "s1", time.Now())
	retry("AddNotifications", func(ctx context.Context) error { return s.AddNotifications(ctx, []*coordinator.Notification{n2}) })
	if n2.Seq != 2 {
		t.Fatalf("the notification written after the loss has seq %d, want 2", n2.Seq)
	}
	want := snapshot(t, s)
	synced, err := OpenState(ctx, nc, openCache(t), StateConfig{Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := synced.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := snapshot(t, synced); got != want {
		t.Fatalf("a cache synced from the two survivors:\n%s\nwant:\n%s", got, want)
	}

	for _, ns := range cluster.Servers {
		if ns != leader {
			ns.Shutdown()
			ns.WaitForShutdown()
			break
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err = s.PutJob(wctx, stateJob("job3", "s1", coordinator.StatusQueued))
	cancel()
	if coordinator.ErrorCode(err) != coordinator.EUNAVAILABLE {
		t.Fatalf("PutJob with one server of three left: %v; want it refused as %s", err, coordinator.EUNAVAILABLE)
	}
	if got := snapshot(t, s); got != want {
		t.Fatalf("reads with one server of three left:\n%s\nwant:\n%s", got, want)
	}
}
