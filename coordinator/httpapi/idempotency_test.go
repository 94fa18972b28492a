package httpapi_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/httpapi"
	"github.com/sbx-dev/sbx/coordinator/natsbus"
	"github.com/sbx-dev/sbx/internal/natstest"
)

// idempotencyBus is a Bus on a real in-process NATS: the store of idempotency keys.
func idempotencyBus(t *testing.T) *natsbus.Bus {
	t.Helper()
	nc := natstest.Conn(t)
	bus, err := natsbus.New(t.Context(), nc, natsbus.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return bus
}

// TestIdempotencyKey: a start repeated with its Idempotency-Key gets the same job and queues
// nothing; the key with another body is idempotency_conflict; another session's same key is
// another start; a bad key is refused naming the header.
func TestIdempotencyKey(t *testing.T) {
	bus := idempotencyBus(t)
	h := newHarnessWith(t, httpapi.Config{}, coordinator.Config{Idempotency: bus})
	h.heartbeat()
	body := map[string]any{"command": "echo once", "cwd": h.cwd}

	first := h.post("/v1/jobs", body, "Idempotency-Key", "k-1")
	if first.status != http.StatusCreated {
		t.Fatalf("first start: %d %s", first.status, first.body)
	}
	var a startReply
	first.decode(t, &a)
	// The same request encoded otherwise (the session in the header, keys reordered) is the same.
	again := h.post("/v1/jobs", `{"cwd":"`+h.cwd+`","command":"echo once"}`, "Idempotency-Key", "k-1", "Sbx-Session", "default")
	if again.status != http.StatusOK {
		t.Fatalf("repeated start: %d %s", again.status, again.body)
	}
	var b startReply
	again.decode(t, &b)
	if b.Job.ID != a.Job.ID {
		t.Errorf("repeated start made job %s, want %s", b.Job.ID, a.Job.ID)
	}
	if n := len(h.disp.Works()); n != 1 {
		t.Errorf("%d jobs queued, want 1", n)
	}

	h.post("/v1/jobs", map[string]any{"command": "echo other", "cwd": h.cwd}, "Idempotency-Key", "k-1").
		wantError(t, http.StatusConflict, "idempotency_conflict", "another request")

	other := h.post("/v1/jobs", body, "Idempotency-Key", "k-1", "Sbx-Session", "s2")
	if other.status != http.StatusCreated {
		t.Fatalf("start in another session: %d %s", other.status, other.body)
	}
	var c startReply
	other.decode(t, &c)
	if c.Job.ID == a.Job.ID || c.Job.Session != "s2" {
		t.Errorf("another session's start: job %s of %s, want a new one of s2", c.Job.ID, c.Job.Session)
	}
	if n := len(h.disp.Works()); n != 2 {
		t.Errorf("%d jobs queued, want 2", n)
	}

	for _, k := range []string{"", strings.Repeat("k", 256), "caf\u00e9", "a\tb"} {
		h.post("/v1/jobs", body, "Idempotency-Key", k).wantError(t, http.StatusBadRequest, "invalid", "Idempotency-Key")
	}
	// A start refused before its job was queued frees its key: the corrected request starts.
	h.post("/v1/jobs", map[string]any{"command": "echo once", "cwd": "relative"}, "Idempotency-Key", "k-2").
		wantError(t, http.StatusBadRequest, "invalid", "cwd")
	if r := h.post("/v1/jobs", body, "Idempotency-Key", "k-2"); r.status != http.StatusCreated {
		t.Fatalf("corrected start: %d %s", r.status, r.body)
	}
	// Without the header, a start is a start.
	h.start(map[string]any{"command": "echo once"})
	h.start(map[string]any{"command": "echo once"})
	if n := len(h.disp.Works()); n != 5 {
		t.Errorf("%d jobs queued, want 5", n)
	}
}

// TestIdempotencyReservation: a key reserved by a start still under way makes a repeat wait and
// then say so; a reservation older than AbandonAfter, whose coordinator died before queuing, is
// taken over and the job started.
func TestIdempotencyReservation(t *testing.T) {
	bus := idempotencyBus(t)
	h := newHarnessWith(t, httpapi.Config{}, coordinator.Config{Idempotency: bus, IdempotencyWait: 200 * time.Millisecond, AbandonAfter: time.Hour})
	h.heartbeat()
	body := map[string]any{"command": "echo once", "cwd": h.cwd}
	// The hash of a request is the domain's; a reservation with a hash of its own would be a
	// conflict, so reserve with the hash the first start records.
	first := h.post("/v1/jobs", body, "Idempotency-Key", "probe")
	if first.status != http.StatusCreated {
		t.Fatalf("start: %d %s", first.status, first.body)
	}
	sum := sha256.Sum256([]byte("default\x00probe"))
	stored, _, created, err := bus.CreateKey(t.Context(), hex.EncodeToString(sum[:]), coordinator.IdempotencyRecord{})
	if err != nil || created || stored.JobID == "" {
		t.Fatalf("stored record %+v, created %v, %v", stored, created, err)
	}
	for _, tt := range []struct {
		key        string
		reservedAt time.Time
		status     int
	}{
		{"under-way", time.Now(), http.StatusConflict},
		{"abandoned", time.Now().Add(-2 * time.Hour), http.StatusCreated},
	} {
		sum := sha256.Sum256([]byte("default\x00" + tt.key))
		if _, _, _, err := bus.CreateKey(t.Context(), hex.EncodeToString(sum[:]), coordinator.IdempotencyRecord{Hash: stored.Hash, ReservedAt: tt.reservedAt}); err != nil {
			t.Fatal(err)
		}
		r := h.post("/v1/jobs", body, "Idempotency-Key", tt.key)
		if r.status != tt.status {
			t.Errorf("%s: status %d, want %d: %s", tt.key, r.status, tt.status, r.body)
		}
	}
	if n := len(h.disp.Works()); n != 2 {
		t.Errorf("%d jobs queued, want 2 (the probe and the abandoned one)", n)
	}
}

// TestIdempotencyRace: starts racing with one key make one job, and every one of them gets it.
func TestIdempotencyRace(t *testing.T) {
	bus := idempotencyBus(t)
	h := newHarnessWith(t, httpapi.Config{}, coordinator.Config{Idempotency: bus})
	h.heartbeat()
	body := map[string]any{"command": "echo once", "cwd": h.cwd}
	ids := make(chan string, 6)
	var wg sync.WaitGroup
	for range cap(ids) {
		wg.Go(func() {
			r := h.post("/v1/jobs", body, "Idempotency-Key", "raced")
			var s startReply
			if r.status/100 == 2 {
				r.decode(t, &s)
			}
			ids <- s.Job.ID
		})
	}
	wg.Wait()
	close(ids)
	first := ""
	for id := range ids {
		if id == "" || first != "" && id != first {
			t.Errorf("job %q, want one job for all", id)
		}
		first = id
	}
	if n := len(h.disp.Works()); n != 1 {
		t.Errorf("%d jobs queued, want 1", n)
	}
}
