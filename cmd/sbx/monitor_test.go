package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"
)

// TestMonitorEndToEnd: a monitor's events are its stdout lines only; its stderr is in the output.
func TestMonitorEndToEnd(t *testing.T) {
	s := startServe(t)
	out, err := s.sbx(t, "run", "--session", "mon", "--monitor", "--title", "watch", "--",
		"sh", "-c", `'echo up; echo oops >&2; sleep 0.3; echo ready'`)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	got := s.events(t, "mon", "has finished")
	if !strings.Contains(got, "up") || !strings.Contains(got, "ready") || strings.Contains(got, "oops") {
		t.Fatalf("monitor notifications, want stdout's lines only:\n%s", got)
	}
	logs, err := s.sbx(t, "logs", id)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs, "oops\n") || !strings.Contains(logs, "up\n") {
		t.Fatalf("output %q, want both streams", logs)
	}
}

// TestWebSocketMonitor: `sbx run --monitor --ws URL` makes each message a monitor event and the
// server's close the end; a source with a command, readonly or a non-ws URL is refused naming it.
func TestWebSocketMonitor(t *testing.T) {
	s := startServe(t)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for _, m := range []string{"build started", "build ok"} {
			if err := c.Write(r.Context(), websocket.MessageText, []byte(m)); err != nil {
				return
			}
		}
		<-release
		_ = c.Close(websocket.StatusNormalClosure, "done")
	}))
	defer srv.Close()
	url := "ws" + strings.TrimPrefix(srv.URL, "http")
	out, err := s.sbx(t, "run", "--session", "ws", "--monitor", "--title", "builds", "--ws", url)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	got := s.events(t, "ws", "build ok")
	if !strings.Contains(got, "build started") {
		t.Fatalf("monitor events:\n%s", got)
	}
	close(release)
	got = s.events(t, "ws", "has finished")
	if !strings.Contains(got, "status: success\ntask_id: "+id) {
		t.Fatalf("finished:\n%s", got)
	}
	logs, err := s.sbx(t, "logs", id)
	if err != nil || logs != "build started\nbuild ok\n[WebSocket closed: 1000 done]\n" {
		t.Fatalf("output %q, %v", logs, err)
	}
	j, err := s.c.Job(t.Context(), id)
	if err != nil || j.Source == nil || j.Source.WS != url || j.Command != "" {
		t.Fatalf("job %+v, %v", j, err)
	}

	for _, tt := range []struct {
		body, field string
	}{
		{`{"command":"true","cwd":"/","source":{"ws":"ws://h/"}}`, "command and source"},
		{`{"readonly":true,"source":{"ws":"ws://h/"}}`, "readonly"},
		{`{"source":{"ws":"http://h/"}}`, "source.ws"},
		{`{"cwd":"/"}`, "command is required"},
	} {
		resp, err := http.Post(s.addr+"/v1/jobs", "application/json", strings.NewReader(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), tt.field) {
			t.Errorf("%s: %d %s, want 400 naming %q", tt.body, resp.StatusCode, b, tt.field)
		}
	}
}
