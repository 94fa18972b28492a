package client_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/coordinator/httpapi"
	"github.com/sbx-dev/sbx/coordinator/natsbus"
	"github.com/sbx-dev/sbx/internal/natstest"
)

// TestStartRetry: the coordinator makes the job and the connection is reset before the reply:
// the client sends the start again with its key and gets that job; one job exists. Without a key
// the reset is the caller's error.
func TestStartRetry(t *testing.T) {
	nc := natstest.Conn(t)
	bus, err := natsbus.New(t.Context(), nc, natsbus.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc, _ := newService(t, coordinator.Config{Idempotency: bus})
	svc.HandleHeartbeat(&coordinator.Heartbeat{Runner: "r1", Pool: "default", Slots: 2, Version: "t", Boot: time.Now()})

	api := httpapi.NewServer(svc, httpapi.Config{}).Handler()
	var resets atomic.Int32 // starts still to answer with a reset
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" && r.URL.Path == "/v1/jobs" && resets.Add(-1) >= 0 {
			api.ServeHTTP(httptest.NewRecorder(), r) // the job is made; its reply is lost
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.SetLinger(0) // a reset, not an orderly close
			}
			conn.Close()
			return
		}
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c := client.New(srv.URL, "")
	jobs := func() int {
		t.Helper()
		js, err := svc.Jobs(t.Context(), coordinator.JobFilter{})
		if err != nil {
			t.Fatal(err)
		}
		return len(js)
	}

	resets.Store(1)
	req := client.StartRequest{Command: "echo once", Cwd: "/", IdempotencyKey: client.NewIdempotencyKey()}
	r, err := c.Start(t.Context(), req)
	if err != nil {
		t.Fatalf("start with a key through a reset: %v", err)
	}
	js, err := svc.Jobs(t.Context(), coordinator.JobFilter{})
	if err != nil || len(js) != 1 || js[0].ID != r.Job.ID {
		t.Fatalf("jobs %v (%v), want the one job %s", js, err, r.Job.ID)
	}

	resets.Store(1)
	req.IdempotencyKey = ""
	if _, err := c.Start(t.Context(), req); err == nil {
		t.Error("start without a key through a reset: no error")
	}
	if n := jobs(); n != 2 {
		t.Errorf("%d jobs, want 2", n)
	}
}
