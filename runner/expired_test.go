package runner

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
)

// TestExpiredWorkAsksFirst: work taken after its not_after starts only once the coordinator confirms
// the job; work it refuses is dropped without running, and work nobody confirms stays queued.
func TestExpiredWorkAsksFirst(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	confirmed := map[string]bool{"wanted": true}
	asked := make(chan string, 16)
	sub, err := h.nc.Subscribe(proto.ConfirmSubjects, func(m *nats.Msg) {
		c, err := proto.DecodeControl(m.Data)
		if err != nil || c.Op != proto.OpConfirm {
			t.Errorf("confirmation request %+v, %v", c, err)
			return
		}
		asked <- c.JobID
		reply := &proto.ControlReply{V: proto.Version, Code: proto.ReplyUnknownJob}
		if confirmed[c.JobID] {
			reply.Code = proto.ReplyOK
		}
		_ = m.Respond(proto.Encode(reply))
	})
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Minute).UnixMilli()
	subject := proto.WorkSubject("default", proto.CapPlain)
	h.submitWork(subject, &proto.Work{JobID: "refused", Command: "touch " + filepath.Join(dir, "refused"), NotAfter: past})
	h.submitWork(subject, &proto.Work{JobID: "wanted", Command: "touch " + filepath.Join(dir, "wanted"), NotAfter: past})
	h.submitWork(subject, &proto.Work{JobID: "fresh", Command: "touch " + filepath.Join(dir, "fresh"), NotAfter: time.Now().Add(time.Hour).UnixMilli()})
	h.startRunner(Config{})

	if e := h.exited("wanted", 10*time.Second); e.Reason != proto.ReasonExit {
		t.Fatalf("confirmed job: %+v", e)
	}
	h.exited("fresh", 10*time.Second)
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case id := <-asked:
			got[id] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("confirmations asked: %v", got)
		}
	}
	if !got["refused"] || !got["wanted"] || got["fresh"] {
		t.Fatalf("confirmations asked for %v, want refused and wanted only", got)
	}
	info, err := h.js.Stream(t.Context(), proto.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	// The refused work is handled after the confirmation's reply: it leaves the stream.
	poll.Within(10*time.Second, func() bool {
		st, err := info.Info(t.Context())
		return err == nil && st.State.Msgs == 0
	})
	if _, err := os.Stat(filepath.Join(dir, "refused")); !os.IsNotExist(err) {
		t.Fatalf("the refused job ran (%v)", err)
	}
	h.mu.Lock()
	n := len(h.events["refused"])
	h.mu.Unlock()
	if n != 0 {
		t.Fatalf("the refused job reported %d events", n)
	}
	if st, _ := info.Info(t.Context()); st.State.Msgs != 0 {
		t.Fatalf("work stream still holds %d messages", st.State.Msgs)
	}

	// Nobody answers: the work stays queued and does not run.
	_ = sub.Unsubscribe()
	h.submitWork(subject, &proto.Work{JobID: "orphan", Command: "touch " + filepath.Join(dir, "orphan"), NotAfter: past})
	time.Sleep(3 * time.Second) // a window in which it may not run
	if _, err := os.Stat(filepath.Join(dir, "orphan")); !os.IsNotExist(err) {
		t.Fatalf("unconfirmed work ran (%v)", err)
	}
	if st, _ := info.Info(t.Context()); st.State.Msgs != 1 {
		t.Fatalf("work stream holds %d messages, want the unconfirmed one", st.State.Msgs)
	}
}
