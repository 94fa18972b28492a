package runner

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sbx-dev/sbx/proto"
)

// wsServer serves one WebSocket per connection that sends msgs, then closes with code (0: stays
// open until the client goes).
func wsServer(t *testing.T, msgs []string, code websocket.StatusCode) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for _, m := range msgs {
			if err := c.Write(r.Context(), websocket.MessageText, []byte(m)); err != nil {
				return
			}
		}
		if code == 0 {
			_, _, _ = c.Read(r.Context()) // until the client closes
			return
		}
		_ = c.Close(code, "bye")
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// TestWebSocketSource: a source job's output is its socket's messages, a line each at least, then a
// line saying how it closed; a normal close is exit 0, another is 1; a timeout closes it; an
// unreachable URL is start_failed.
func TestWebSocketSource(t *testing.T) {
	h := newHarness(t)
	h.startRunner(Config{Slots: 4})
	tests := []struct {
		name   string
		url    string
		limits proto.Limits
		reason string
		code   int
		output string
	}{
		{"normal close", wsServer(t, []string{"a", "b\nc", "d\n"}, websocket.StatusNormalClosure), proto.Limits{}, proto.ReasonExit, 0,
			"a\nb\nc\nd\n[WebSocket closed: 1000 bye]\n"},
		{"error close", wsServer(t, []string{"x"}, websocket.StatusInternalError), proto.Limits{}, proto.ReasonExit, 1,
			"x\n[WebSocket closed: 1011 bye]\n"},
		{"timeout", wsServer(t, []string{"tick"}, 0), proto.Limits{TimeoutMS: 300}, proto.ReasonTimeout, 143, "tick\n"},
		{"unreachable", "ws://127.0.0.1:1/none", proto.Limits{}, proto.ReasonStartFailed, -1, ""},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := h.submitWork(proto.WorkSubject("default", proto.CapPlain), &proto.Work{
				JobID: fmt.Sprintf("ws-%d-%d", i, time.Now().UnixNano()), Source: &proto.Source{WS: tt.url}, Limits: tt.limits,
			})
			e := h.exited(id, 20*time.Second)
			if e.Reason != tt.reason || (tt.code >= 0 && (e.ExitCode == nil || *e.ExitCode != tt.code)) {
				t.Fatalf("exited %+v (code %v), want %s %d", e, deref(e.ExitCode), tt.reason, tt.code)
			}
			if got := h.out(id); got != tt.output {
				t.Fatalf("output %q, want %q", got, tt.output)
			}
		})
	}
}
