package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/api"
	"github.com/sbx-dev/sbx/coordinator/httpapi"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
)

// The notification wire types are the API's, as the server encodes them and the Go client decodes
// them.
type (
	notification       = api.Notification
	notificationsReply = api.NotificationsReply
)

func (h *harness) notifications(query string) notificationsReply {
	h.t.Helper()
	r := h.get("/v1/notifications" + query)
	if r.status != http.StatusOK {
		h.t.Fatalf("notifications: %d %s", r.status, r.body)
	}
	var n notificationsReply
	r.decode(h.t, &n)
	return n
}

// TestNotifications: a backgrounded job's end is one notification with its text; ack moves the
// cursor; a job that ended within block_until_ms sends none.
func TestNotifications(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.finishWith("boom\n", 1)
	s := h.start(map[string]any{"command": "false", "title": "unit tests", "tool_use_id": "toolu_01"})
	h.start(map[string]any{"command": "false", "block_until_ms": 5000})
	if s.Job.ToolCallID != "toolu_01" {
		t.Errorf("job's tool_call_id %q, want tool_use_id's", s.Job.ToolCallID)
	}
	if r := h.post("/v1/jobs", map[string]any{"command": "true", "cwd": h.cwd, "tool_call_id": "a", "tool_use_id": "b"}); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "tool_use_id") {
		t.Errorf("two tool call ids: %d %s", r.status, r.body)
	}
	n := h.notifications("")
	if len(n.Notifications) != 1 || n.Next != 1 {
		t.Fatalf("notifications %+v", n)
	}
	got := n.Notifications[0]
	if got.Seq != 1 || got.Session != "default" || got.Kind != "finished" || got.Status != "error" ||
		got.JobID != s.Job.ID || got.Detail != "exit_code=1" || got.Title != "unit tests" || got.OutputPath == "" {
		t.Fatalf("notification %+v", got)
	}
	if !strings.Contains(got.Text, "status: error\ntask_id: "+s.Job.ID+"\ntitle: unit tests\ntool_call_id: toolu_01\ndetail: exit_code=1\n</task>") {
		t.Fatalf("text:\n%s", got.Text)
	}
	if r := h.post("/v1/notifications/ack", map[string]any{"session": "default", "seq": 1}); r.status != http.StatusOK {
		t.Fatalf("ack: %d %s", r.status, r.body)
	}
	if n := h.notifications("?session=default"); len(n.Notifications) != 0 || n.Next != 1 {
		t.Fatalf("after the ack: %+v", n)
	}
	if n := h.notifications("?after=0"); len(n.Notifications) != 1 {
		t.Fatalf("after=0: %+v", n)
	}
}

// TestNotificationFormats: a session opened with format task_notification gets Claude Code's
// <task-notification> texts, a start's notification_format overrides it, and a read's or a stream's
// format parameter rewrites the texts it returns.
func TestNotificationFormats(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.finishWith("boom\n", 1)
	r := h.post("/v1/sessions", map[string]any{"id": "claude", "format": "task_notification"})
	var open struct {
		Session api.Session `json:"session"`
	}
	r.decode(t, &open)
	if r.status != http.StatusOK || open.Session.Format != "task_notification" {
		t.Fatalf("open: %d %s", r.status, r.body)
	}
	a := h.start(map[string]any{"command": "false", "title": "unit tests", "session": "claude"})
	b := h.start(map[string]any{"command": "false", "session": "claude", "notification_format": "system_notification"})
	n := h.notifications("?session=claude")
	if len(n.Notifications) != 2 {
		t.Fatalf("notifications %+v", n)
	}
	got := n.Notifications[0]
	want := "<task-notification>\n<task_id>" + a.Job.ID + "</task_id>\n<output_file>" + got.OutputPath + "</output_file>\n<status>failed</status>\n" +
		"<summary>Async command \"unit tests\" failed with exit code 1</summary>\n</task-notification>"
	if got.Format != "task_notification" || got.Text != want || got.Detail != "exit_code=1" {
		t.Fatalf("notification %+v\nwant text\n%s", got, want)
	}
	if got := n.Notifications[1]; got.JobID != b.Job.ID || got.Format != "system_notification" || !strings.HasPrefix(got.Text, "<system_notification>\n") {
		t.Fatalf("notification_format: %+v", got)
	}
	for _, f := range []string{"system_notification", "task_notification"} {
		n := h.notifications("?session=claude&format=" + f)
		for _, got := range n.Notifications {
			if got.Format != f || strings.HasPrefix(got.Text, "<system_notification>") != (f == "system_notification") {
				t.Fatalf("read as %s: %+v", f, got)
			}
		}
	}
	if n := h.notifications("?session=default"); len(n.Notifications) != 0 {
		t.Fatalf("default session: %+v", n)
	}
	def := h.start(map[string]any{"command": "false"})
	if n := h.notifications("?session=default"); len(n.Notifications) != 1 || n.Notifications[0].JobID != def.Job.ID || n.Notifications[0].Format != "system_notification" {
		t.Fatalf("default format: %+v", n)
	}

	req, _ := http.NewRequestWithContext(t.Context(), "GET", h.url+"/v1/notifications/stream?session=claude&after=0&format=system_notification", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var got notification
			if err := json.Unmarshal([]byte(data), &got); err != nil {
				t.Fatal(err)
			}
			if got.JobID != a.Job.ID || got.Format != "system_notification" || !strings.HasPrefix(got.Text, "<system_notification>\n") {
				t.Fatalf("stream: %+v", got)
			}
			return
		}
	}
	t.Fatal("the stream ended without an event")
}

// TestLongPoll: a long-poll returns as soon as a notification is stored.
func TestLongPoll(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.startOnly()
	s := h.start(map[string]any{"command": "sleep 1", "session": "s1"})
	got := make(chan notificationsReply, 1)
	go func() {
		r := h.get("/v1/notifications?session=s1&wait_ms=10000")
		var n notificationsReply
		json.Unmarshal(r.body, &n)
		got <- n
	}()
	// Let the long-poll begin waiting: nothing shows that it does, and one that began late would
	// find the notification stored and pass without waiting.
	time.Sleep(30 * time.Millisecond)
	t0 := time.Now()
	h.exit(s.Job.ID, 0, 0)
	select {
	case n := <-got:
		if len(n.Notifications) != 1 || n.Notifications[0].Status != "success" {
			t.Fatalf("long-poll: %+v", n)
		}
		if d := time.Since(t0); d > time.Second {
			t.Fatalf("long-poll answered after %s", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the long-poll did not return")
	}
}

// TestStream: notifications as Server-Sent Events, resumed from Last-Event-ID.
func TestStream(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.finishWith("", 0)
	var ids []string
	for range 3 {
		ids = append(ids, h.start(map[string]any{"command": "true"}).Job.ID)
	}
	req, _ := http.NewRequestWithContext(t.Context(), "GET", h.url+"/v1/notifications/stream?session=default", nil)
	req.Header.Set("Last-Event-ID", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := make(chan [2]string)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		var id string
		for sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "id: "); ok {
				id = v
			}
			if v, ok := strings.CutPrefix(line, "data: "); ok {
				events <- [2]string{id, v}
			}
		}
		close(events)
	}()
	next := func() (string, notification) {
		t.Helper()
		select {
		case ev := <-events:
			var n notification
			if err := json.Unmarshal([]byte(ev[1]), &n); err != nil {
				t.Fatal(err)
			}
			return ev[0], n
		case <-time.After(5 * time.Second):
			t.Fatal("no event")
		}
		return "", notification{}
	}
	for i, want := range []string{ids[1], ids[2]} {
		if id, n := next(); id != []string{"2", "3"}[i] || n.JobID != want {
			t.Fatalf("event %d: id %s %+v", i, id, n)
		}
	}
	ids = append(ids, h.start(map[string]any{"command": "true"}).Job.ID)
	if id, n := next(); id != "4" || n.JobID != ids[3] {
		t.Fatalf("live event: id %s %+v", id, n)
	}
}

// TestEndSession: ending a session stops its jobs as session_ended, without notifications.
func TestEndSession(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.startOnly()
	h.disp.SetControl(func(_ context.Context, _ string, c *coordinator.Control) error {
		if c.Op == proto.OpKill {
			go h.killed(c.JobID)
		}
		return nil
	})
	s := h.start(map[string]any{"command": "sleep 100"}, "Sbx-Session", "agent-1")
	r := h.do("DELETE", "/v1/sessions/agent-1", nil)
	if r.status != http.StatusOK {
		t.Fatalf("end: %d %s", r.status, r.body)
	}
	var end struct {
		Session struct {
			ID      string     `json:"id"`
			EndedAt *time.Time `json:"ended_at"`
		} `json:"session"`
		Stopped []string `json:"stopped"`
	}
	r.decode(t, &end)
	if end.Session.ID != "agent-1" || end.Session.EndedAt == nil || len(end.Stopped) != 1 || end.Stopped[0] != s.Job.ID {
		t.Fatalf("end: %s", r.body)
	}
	var j job
	poll.Within(5*time.Second, func() bool {
		h.get("/v1/jobs/"+s.Job.ID).decode(t, &j)
		return j.Status == "aborted"
	})
	if j.Status != "aborted" || j.Reason != "session_ended" {
		t.Fatalf("job %+v", j)
	}
	if n := h.notifications("?session=agent-1&after=0"); len(n.Notifications) != 0 {
		t.Fatalf("notified: %+v", n)
	}
}

// TestLeaseAPI: a session opened with a lease ends when not renewed; renew moves expires_at.
func TestLeaseAPI(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	r := h.post("/v1/sessions", map[string]any{"id": "sub", "lease_ms": 300})
	if r.status != http.StatusOK {
		t.Fatalf("open: %d %s", r.status, r.body)
	}
	if r := h.post("/v1/sessions/sub/renew", nil); r.status != http.StatusOK {
		t.Fatalf("renew: %d %s", r.status, r.body)
	}
	// Nothing runs Service.Run in this harness: end it the way an expired lease does.
	if r := h.do("DELETE", "/v1/sessions/sub", nil); r.status != http.StatusOK {
		t.Fatalf("end: %d %s", r.status, r.body)
	}
	h.post("/v1/sessions/sub/renew", nil).wantError(t, http.StatusConflict, "conflict", `"sub" has ended`)
	h.post("/v1/sessions/nope/renew", nil).wantError(t, http.StatusNotFound, "not_found", `"nope"`)
	h.do("DELETE", "/v1/sessions/nope", nil).wantError(t, http.StatusNotFound, "not_found", `"nope"`)
}

// TestNotificationsInvalid: bad input is a 4xx naming the field.
func TestNotificationsInvalid(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.finishWith("", 0)
	h.start(map[string]any{"command": "true"})
	tests := []struct {
		name   string
		r      *reply
		status int
		code   string
		want   string
	}{
		{"bad regex", h.post("/v1/jobs", map[string]any{"command": "x", "cwd": h.cwd, "notify_on_output": map[string]any{"pattern": "(x"}}), 400, "invalid", "notify_on_output.pattern"},
		{"long pattern", h.post("/v1/jobs", map[string]any{"command": "x", "cwd": h.cwd, "notify_on_output": map[string]any{"pattern": strings.Repeat("x", 501)}}), 400, "invalid", "notify_on_output.pattern"},
		{"negative debounce", h.post("/v1/jobs", map[string]any{"command": "x", "cwd": h.cwd, "notify_on_output": map[string]any{"pattern": "x", "debounce_ms": -5}}), 400, "invalid", "notify_on_output.debounce_ms"},
		{"ack unknown session", h.post("/v1/notifications/ack", map[string]any{"session": "ghost", "seq": 1}), 404, "not_found", `"ghost"`},
		{"ack beyond", h.post("/v1/notifications/ack", map[string]any{"session": "default", "seq": 9}), 400, "invalid", "seq 9"},
		{"after in the future", h.get("/v1/notifications?after=7"), 400, "invalid", "after 7"},
		{"after not a number", h.get("/v1/notifications?after=-1"), 400, "invalid", "after"},
		{"wait_ms too long", h.get("/v1/notifications?wait_ms=300001"), 400, "invalid", "wait_ms"},
		{"bad session", h.get("/v1/notifications?session=a.b"), 400, "invalid", "session"},
		{"bad Last-Event-ID", h.get("/v1/notifications/stream", "Last-Event-ID", "x"), 400, "invalid", "Last-Event-ID"},
		{"lease negative", h.post("/v1/sessions", map[string]any{"id": "s", "lease_ms": -1}), 400, "invalid", "lease_ms"},
		{"session without id", h.post("/v1/sessions", map[string]any{"lease_ms": 1000}), 400, "invalid", "id"},
		{"session format", h.post("/v1/sessions", map[string]any{"id": "s", "format": "xml"}), 400, "invalid", "format"},
		{"start format", h.post("/v1/jobs", map[string]any{"command": "x", "cwd": h.cwd, "notification_format": "markdown"}), 400, "invalid", "notification_format"},
		{"read format", h.get("/v1/notifications?format=json"), 400, "invalid", "format"},
		{"stream format", h.get("/v1/notifications/stream?format=json"), 400, "invalid", "format"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.r.wantError(t, tt.status, tt.code, tt.want) })
	}
	// As the seed tools do, a long reason is cut and a short debounce raised, not refused.
	r := h.post("/v1/jobs", map[string]any{"command": "x", "cwd": h.cwd, "notify_on_output": map[string]any{"pattern": "x", "reason": strings.Repeat("x", 501), "debounce_ms": 100}})
	var started struct {
		Job struct {
			Notify struct {
				Reason     string `json:"reason"`
				DebounceMS int64  `json:"debounce_ms"`
			} `json:"notify_on_output"`
		} `json:"job"`
	}
	r.decode(t, &started)
	if n := started.Job.Notify; r.status != http.StatusCreated || n.Reason != strings.Repeat("x", 500)+"..." || n.DebounceMS != 5000 {
		t.Errorf("long reason, short debounce: %d %s", r.status, r.body)
	}
}
