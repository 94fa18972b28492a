package httpapi_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/httpapi"
	"github.com/sbx-dev/sbx/internal/poll"
)

// TestForwarder: a standby's forwarder passes calls to the coordinator that leads, unchanged, and
// answers 503 while none leads or the leader does not answer; its own probes say whom it follows.
func TestForwarder(t *testing.T) {
	const token = "0123456789abcdef0123"
	leader := newHarness(t, httpapi.Config{Token: token})
	leader.finishWith("hello\n", 0)

	var leaderURL atomic.Value
	leaderURL.Store("")
	fwd := httpapi.NewForwarder(httpapi.Config{Token: token}, func() (string, string) { return "coord-a", leaderURL.Load().(string) })
	srv := httptest.NewServer(checkContract(t, fwd.Handler(), func(err error) { t.Error(err) }))
	t.Cleanup(srv.Close)
	standby := &harness{t: t, url: srv.URL, cwd: leader.cwd}
	auth := []string{"Authorization", "Bearer " + token}

	standby.post("/v1/jobs", map[string]any{"command": "true", "cwd": leader.cwd}, auth...).
		wantError(t, http.StatusServiceUnavailable, "unavailable", "no coordinator leads yet")
	standby.get("/readyz").wantError(t, http.StatusServiceUnavailable, "unavailable", "no coordinator leads yet")

	leaderURL.Store(leader.url)
	started := standby.start(map[string]any{"command": "echo hello", "block_until_ms": 5000}, auth...)
	if started.Job.Status != "succeeded" || started.Output != "hello\n" {
		t.Fatalf("start through the standby: %+v", started)
	}
	var direct job
	leader.get("/v1/jobs/"+started.Job.ID, auth...).decode(t, &direct)
	var via job
	standby.get("/v1/jobs/"+started.Job.ID, auth...).decode(t, &via)
	if via.ID != direct.ID || via.Status != direct.Status || direct.ID == "" {
		t.Errorf("job through the standby %+v, through the leader %+v", via, direct)
	}
	if out := standby.get("/v1/jobs/"+started.Job.ID+"/output", auth...); out.status != http.StatusOK || string(out.body) != "hello\n" {
		t.Errorf("output through the standby: %d %q", out.status, out.body)
	}
	// The standby checks the token itself: a stranger never reaches the leader.
	standby.post("/v1/jobs", map[string]any{"command": "true"}).wantError(t, http.StatusUnauthorized, "unauthorized", "Bearer")
	if n := len(leader.disp.Works()); n != 1 {
		t.Errorf("the leader dispatched %d jobs, want 1", n)
	}

	var ready struct {
		Leader   bool   `json:"leader"`
		LeaderID string `json:"leader_id"`
	}
	r := standby.get("/readyz")
	r.decode(t, &ready)
	if r.status != http.StatusOK || ready.Leader || ready.LeaderID != "coord-a" {
		t.Errorf("standby /readyz: %d %s", r.status, r.body)
	}
	if m := standby.get("/metrics"); m.status != http.StatusOK || !strings.Contains(string(m.body), `sbx_http_requests_total{code="201"} 1`) ||
		!strings.Contains(string(m.body), "sbx_coordinator_leader 0\n") {
		t.Errorf("standby /metrics: %d %s", m.status, m.body)
	}

	// A leader that is gone: the caller is told to retry.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	leaderURL.Store("http://" + ln.Addr().String())
	ln.Close()
	standby.get("/v1/jobs", auth...).wantError(t, http.StatusServiceUnavailable, "unavailable", "did not answer")
}

// TestForwarderStreams: a stream through the forwarder reaches the client as the leader writes it,
// not when it ends.
func TestForwarderStreams(t *testing.T) {
	leader := newHarness(t, httpapi.Config{})
	leader.startOnly()
	fwd := httptest.NewServer(httpapi.NewForwarder(httpapi.Config{}, func() (string, string) { return "a", leader.url }).Handler())
	t.Cleanup(fwd.Close)
	started := leader.start(map[string]any{"command": "sleep 100"})
	leader.output(started.Job.ID, 0, "first\n")

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", fwd.URL+"/v1/jobs/"+started.Job.ID+"/output?follow=true", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first\n" {
		t.Fatalf("followed output through the standby: %q, %v", buf, err)
	}
	leader.output(started.Job.ID, 6, "second\n")
	buf = make([]byte, 7)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "second\n" {
		t.Fatalf("followed output through the standby: %q, %v", buf, err)
	}
}

// TestHandoff: a standby's forwarder hands its socket over to the API when its process takes the
// lead; no call fails in between: each is answered by the forwarder (503 while no one leads, then
// forwarded to the new leader at the same address) or by the API itself.
func TestHandoff(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	self := "http://" + ln.Addr().String()
	handoff, err := httpapi.NewHandoff(ln)
	if err != nil {
		t.Fatal(err)
	}
	var leading atomic.Bool
	fwd := httpapi.NewForwarder(httpapi.Config{}, func() (string, string) {
		if leading.Load() {
			return "self", self
		}
		return "", ""
	})
	l1, err := handoff.Listener()
	if err != nil {
		t.Fatal(err)
	}
	fwd.Open(l1)
	defer fwd.Close(t.Context())
	if _, err := handoff.Listener(); err == nil {
		t.Fatal("a second listener while the first is open")
	}

	var (
		mu     sync.Mutex
		codes  = map[int]int{}
		failed []error
	)
	count := func(code int) int {
		mu.Lock()
		defer mu.Unlock()
		return codes[code]
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 4 {
		// Half the callers keep their connections alive, half open one per call.
		client := &http.Client{Transport: &http.Transport{DisableKeepAlives: i%2 == 0}, Timeout: 10 * time.Second}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Get(self + "/v1/runners")
				mu.Lock()
				if err != nil {
					failed = append(failed, err)
				} else {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					codes[resp.StatusCode]++
				}
				mu.Unlock()
			}
		})
	}
	waitFor := func(code int) {
		t.Helper()
		if !poll.Within(10*time.Second, func() bool { return count(code) >= 50 }) {
			t.Fatalf("%d calls answered %d in 10 s", count(code), code)
		}
	}
	waitFor(http.StatusServiceUnavailable)
	// The order of a takeover: the forwarder lets the socket go, the API takes it, and only then
	// does the forwarder send what it still receives to the new leader.
	if err := fwd.StopAccepting(); err != nil {
		t.Fatal(err)
	}
	l2, err := handoff.Listener()
	if err != nil {
		t.Fatal(err)
	}
	api := httpapi.NewServer(h.svc, httpapi.Config{})
	api.Open(l2)
	defer api.Close(t.Context())
	leading.Store(true)
	waitFor(http.StatusOK)
	close(stop)
	wg.Wait()
	if len(failed) > 0 {
		t.Errorf("%d calls failed across the handoff, first: %v", len(failed), failed[0])
	}
	if other := len(codes) - 2; other != 0 {
		t.Errorf("statuses %v, want only 503 and 200", codes)
	}
}
