package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/coordinator/coordinatortest"
	"github.com/sbx-dev/sbx/coordinator/httpapi"
	"github.com/sbx-dev/sbx/coordinator/store"
	"github.com/sbx-dev/sbx/proto"
)

type harness struct {
	t    *testing.T
	svc  *coordinator.Service
	disp *coordinatortest.Dispatcher
	srv  *httpapi.Server
	addr string
	cwd  string
}

// newService makes a real Service with cfg on the real store, dispatching to a fake that stands in
// for the runners: queued work is withdrawn, and a control request ends the job as killed.
func newService(t *testing.T, cfg coordinator.Config) (*coordinator.Service, *coordinatortest.Dispatcher) {
	t.Helper()
	dir := t.TempDir()
	db, err := store.Open(dir + "/db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	terms, err := store.OpenTerminals(dir + "/terminals")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { terms.Close() })
	disp := &coordinatortest.Dispatcher{}
	disp.SetWithdraw(true)
	svc, err := coordinator.New(t.Context(), cfg, db, terms, disp)
	if err != nil {
		t.Fatal(err)
	}
	disp.SetControl(func(ctx context.Context, runner string, c *coordinator.Control) error {
		return svc.HandleEvent(ctx, coordinatortest.Claimed(svc, &coordinator.Event{
			Kind: proto.EventExited, JobID: c.JobID, Runner: runner, Time: time.Now(), Reason: proto.ReasonKilled,
		}))
	})
	return svc, disp
}

// newHarness serves a real Service on the real store with the API on a real listener.
func newHarness(t *testing.T, token string) *harness {
	t.Helper()
	svc, disp := newService(t, coordinator.Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httpapi.NewServer(svc, httpapi.Config{Token: token})
	srv.Open(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	return &harness{t: t, svc: svc, disp: disp, srv: srv, addr: "http://" + ln.Addr().String(), cwd: t.TempDir()}
}

func (h *harness) event(e *coordinator.Event) {
	h.t.Helper()
	e.Runner, e.Time = "r1", time.Now()
	if err := h.svc.HandleEvent(context.Background(), coordinatortest.Claimed(h.svc, e)); err != nil {
		h.t.Error(err)
	}
}

func (h *harness) begin(id string) {
	h.event(&coordinator.Event{Kind: proto.EventAccepted, JobID: id})
	h.event(&coordinator.Event{Kind: proto.EventStarted, JobID: id, Pid: 7})
}

func (h *harness) output(id string, offset int64, data string) {
	h.t.Helper()
	if err := h.svc.HandleChunk(context.Background(), coordinatortest.ClaimedChunk(h.svc, &coordinator.Chunk{JobID: id, Offset: offset, Data: []byte(data)})); err != nil {
		h.t.Error(err)
	}
}

func (h *harness) exit(id string, code int, size int64) {
	h.event(&coordinator.Event{Kind: proto.EventExited, JobID: id, Reason: proto.ReasonExit, ExitCode: &code, OutputBytes: size})
}

func TestJobLifecycle(t *testing.T) {
	h := newHarness(t, "tok")
	c := client.New(h.addr+"/", "tok")
	ctx := t.Context()
	h.disp.SetRun(func(w *coordinator.Work) {
		h.begin(w.JobID)
		h.output(w.JobID, 0, "hello\n")
		h.exit(w.JobID, 0, 6)
	})

	st, err := c.Start(ctx, client.StartRequest{
		Command: "echo hello", Cwd: h.cwd, Session: "s1", BlockUntil: 5 * time.Second,
		Limits: &client.Limits{Pids: 64}, Env: map[string]string{"A": "1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Backgrounded || st.Output != "hello\n" || st.Job.Status != client.StatusSucceeded || !st.Job.Ended() {
		t.Errorf("start %+v", st)
	}
	if st.Job.ExitCode == nil || *st.Job.ExitCode != 0 || st.Job.Limits.Pids != 64 || st.Job.Session != "s1" {
		t.Errorf("job %+v", st.Job)
	}
	id := st.Job.ID

	j, err := c.Job(ctx, id)
	if err != nil || j.ID != id || j.OutputBytes != 6 {
		t.Errorf("job %+v, %v", j, err)
	}
	jobs, err := c.Jobs(ctx, client.JobsQuery{Session: "s1", Limit: 10})
	if err != nil || len(jobs) != 1 || jobs[0].ID != id {
		t.Errorf("jobs %+v, %v", jobs, err)
	}
	if jobs, err := c.Jobs(ctx, client.JobsQuery{Session: "other"}); err != nil || len(jobs) != 0 {
		t.Errorf("other session: %+v, %v", jobs, err)
	}
	w, err := c.Wait(ctx, id, 0, "")
	if err != nil || !w.Done {
		t.Errorf("wait %+v, %v", w, err)
	}
	out, total, err := c.Output(ctx, id, 1, 3)
	if err != nil || string(out) != "ell" || total != 6 {
		t.Errorf("output %q %d %v", out, total, err)
	}
	out, _, err = c.Output(ctx, id, 0, -1)
	if err != nil || string(out) != "hello\n" {
		t.Errorf("output %q %v", out, err)
	}
	var buf bytes.Buffer
	if err := c.Follow(ctx, id, 0, &buf); err != nil || buf.String() != "hello\n" {
		t.Errorf("follow of an ended job: %q %v", buf.String(), err)
	}
	_, err = c.Kill(ctx, id, "")
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != 409 || apiErr.Code != "conflict" {
		t.Errorf("kill of an ended job: %v", err)
	}
}

func TestWaitAndKill(t *testing.T) {
	h := newHarness(t, "")
	c := client.New(h.addr, "")
	c.Session = "hdr"
	ctx := t.Context()
	h.disp.SetRun(func(w *coordinator.Work) { h.begin(w.JobID) })

	st, err := c.Start(ctx, client.StartRequest{Command: "serve", Cwd: h.cwd})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Backgrounded || st.Job.Session != "hdr" || st.Job.Status != client.StatusRunning {
		t.Errorf("start %+v", st)
	}
	id := st.Job.ID
	h.output(id, 0, "starting\nready at :8080\n")
	w, err := c.Wait(ctx, id, 10*time.Second, `^ready at :\d+$`)
	if err != nil || !w.PatternMatched || w.Done {
		t.Errorf("wait %+v, %v", w, err)
	}
	w, err = c.Wait(ctx, id, 10*time.Millisecond, "never")
	if err != nil || w.PatternMatched || w.Done {
		t.Errorf("wait %+v, %v", w, err)
	}

	var buf bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- c.Follow(ctx, id, 9, &buf) }()
	// Let Follow begin following: nothing shows that it does, and one begun late reads the same
	// output up to the end.
	time.Sleep(50 * time.Millisecond)
	j, err := c.Kill(ctx, id, "TERM")
	if err != nil || j.Status != client.StatusAborted || j.Reason != "killed" {
		t.Errorf("kill %+v, %v", j, err)
	}
	if err := <-done; err != nil || buf.String() != "ready at :8080\n" {
		t.Errorf("follow %q, %v", buf.String(), err)
	}
}

func TestErrors(t *testing.T) {
	h := newHarness(t, "tok")
	ctx := t.Context()
	c := client.New(h.addr, "tok")
	tests := []struct {
		name   string
		call   func() error
		status int
		code   string
		want   string
	}{
		{"unauthorized", func() error { _, err := client.New(h.addr, "bad").Runners(ctx); return err }, 401, "unauthorized", "Bearer"},
		{"not found", func() error { _, err := c.Job(ctx, "0000000000000"); return err }, 404, "not_found", "does not exist"},
		{"invalid start", func() error { _, err := c.Start(ctx, client.StartRequest{Command: "ls", Cwd: "rel"}); return err }, 400, "invalid", "cwd"},
		{"bad pattern", func() error { _, err := c.Wait(ctx, "x", time.Second, "("); return err }, 400, "invalid", "pattern"},
		{"bad status", func() error { _, err := c.Jobs(ctx, client.JobsQuery{Status: "done"}); return err }, 400, "invalid", "status"},
		{"output of unknown", func() error { _, _, err := c.Output(ctx, "nope", 0, -1); return err }, 404, "not_found", "nope"},
		{"follow of unknown", func() error { return c.Follow(ctx, "nope", 0, &bytes.Buffer{}) }, 404, "not_found", "nope"},
		{"not the API", func() error { _, err := c.Do(ctx, "GET", "/nothing", nil); return err }, 404, "not_found", "No endpoint"},
		// Every id is one path segment, whatever it holds: none reaches another route.
		{"id .", func() error { _, err := c.Job(ctx, "."); return err }, 400, "invalid", `job id "."`},
		{"id ..", func() error { _, err := c.Job(ctx, ".."); return err }, 400, "invalid", `job id ".."`},
		{"id with slashes", func() error { _, err := c.Job(ctx, "../../healthz"); return err }, 400, "invalid", `job id "../../healthz"`},
		{"wait id", func() error { _, err := c.Wait(ctx, "../runners?", 0, ""); return err }, 400, "invalid", "job id"},
		{"output id", func() error { _, _, err := c.Output(ctx, "..", 0, -1); return err }, 400, "invalid", "job id"},
		{"kill id", func() error { _, err := c.Kill(ctx, ".", ""); return err }, 400, "invalid", `job id "."`},
		{"session id", func() error { _, err := c.EndSession(ctx, ".."); return err }, 400, "invalid", `session id ".."`},
		{"renew id", func() error { _, err := c.RenewSession(ctx, "a/../b"); return err }, 400, "invalid", `session id "a/../b"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			var e *client.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T), want *client.Error", err, err)
			}
			if e.Status != tt.status || e.Code != tt.code || !strings.Contains(e.Message, tt.want) {
				t.Errorf("error %+v, want %d %s with %q", e, tt.status, tt.code, tt.want)
			}
		})
	}
}

// TestDo checks that the raw replies are the API's JSON and that the typed values re-encode to it.
func TestDo(t *testing.T) {
	h := newHarness(t, "")
	c := client.New(h.addr, "")
	ctx := t.Context()
	h.svc.HandleHeartbeat(&coordinator.Heartbeat{Runner: "r1", Pool: "default", Slots: 2, Version: "t", Boot: time.Now()})

	raw, err := c.Do(ctx, "POST", "/v1/jobs", map[string]any{"command": "ls", "cwd": h.cwd})
	if err != nil {
		t.Fatal(err)
	}
	var st client.StartReply
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	again, _ := json.Marshal(st)
	if got, want := compact(t, again), compact(t, raw); got != want {
		t.Errorf("re-encoded start reply\n%s\nwant\n%s", got, want)
	}
	raw, err = c.Do(ctx, "GET", client.JobsPath(client.JobsQuery{Limit: 1}), nil)
	if err != nil || !strings.Contains(string(raw), st.Job.ID) {
		t.Errorf("jobs %s, %v", raw, err)
	}
	raw, err = c.Do(ctx, "GET", client.WaitPath(st.Job.ID, 0, ""), nil)
	if err != nil || !strings.Contains(string(raw), `"done":false`) {
		t.Errorf("wait %s, %v", raw, err)
	}
	runners, err := c.Runners(ctx)
	if err != nil || len(runners) != 1 || runners[0].ID != "r1" || runners[0].Slots != 2 {
		t.Errorf("runners %+v, %v", runners, err)
	}
}

// TestFollowCut checks that a stream the server cuts short is an error, not the job's end.
func TestFollowCut(t *testing.T) {
	h := newHarness(t, "")
	c := client.New(h.addr, "")
	h.disp.SetRun(func(w *coordinator.Work) { h.begin(w.JobID) })
	st, err := c.Start(t.Context(), client.StartRequest{Command: "tail -f", Cwd: h.cwd})
	if err != nil {
		t.Fatal(err)
	}
	h.output(st.Job.ID, 0, "x\n")
	w := &firstWrite{seen: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- c.Follow(t.Context(), st.Job.ID, 0, w) }()
	<-w.seen // the stream is open
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := h.srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "before the job ended") {
		t.Errorf("follow cut by Close: %v", err)
	}
}

func compact(t *testing.T, data []byte) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, data); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// firstWrite closes seen at its first write.
type firstWrite struct {
	once sync.Once
	seen chan struct{}
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.seen) })
	return len(p), nil
}

// TestNotificationFormat: the session's format, a start's format and a read's format reach the
// server and come back in the notification objects.
func TestNotificationFormat(t *testing.T) {
	h := newHarness(t, "")
	c := client.New(h.addr, "")
	ctx := t.Context()
	h.disp.SetRun(func(w *coordinator.Work) {
		h.begin(w.JobID)
		h.exit(w.JobID, 0, 0)
	})
	st, err := c.OpenSessionWith(ctx, "claude", 0, client.FormatTask)
	if err != nil || st.Format != client.FormatTask {
		t.Fatalf("open: %+v, %v", st, err)
	}
	if st, err := c.OpenSession(ctx, "claude", time.Minute); err != nil || st.Format != client.FormatTask || st.LeaseMS != 60000 {
		t.Fatalf("reopen keeps the format: %+v, %v", st, err)
	}
	for _, f := range []string{"", client.FormatSystem} {
		if _, err := c.Start(ctx, client.StartRequest{Command: "true", Cwd: h.cwd, Session: "claude", NotificationFormat: f}); err != nil {
			t.Fatal(err)
		}
	}
	after := uint64(0)
	page, err := c.QueryNotifications(ctx, client.NotificationsQuery{Session: "claude", After: &after, Wait: 5 * time.Second})
	for err == nil && len(page.Notifications) < 2 {
		page, err = c.QueryNotifications(ctx, client.NotificationsQuery{Session: "claude", After: &after, Wait: 5 * time.Second})
	}
	if err != nil || page.Notifications[0].Format != client.FormatTask || page.Notifications[1].Format != client.FormatSystem ||
		!strings.HasPrefix(page.Notifications[0].Text, "<task-notification>") {
		t.Fatalf("stored formats: %+v, %v", page, err)
	}
	page, err = c.QueryNotifications(ctx, client.NotificationsQuery{Session: "claude", After: &after, Limit: 1, Format: client.FormatTask})
	if err != nil || len(page.Notifications) != 1 || page.Next != 1 || page.Notifications[0].Format != client.FormatTask {
		t.Fatalf("read as task_notification: %+v, %v", page, err)
	}
}

// TestFromEnv: the environment every client command reads.
func TestFromEnv(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		env  func(string) string
		want string // in the error; "" for none
	}{
		{"defaults", env(), ""},
		{"https", env("SBX_ADDR", "https://sbx.example.com:7070"), ""},
		{"no scheme", env("SBX_ADDR", "127.0.0.1:7070"), "SBX_ADDR"},
		{"other scheme", env("SBX_ADDR", "ftp://x"), "SBX_ADDR"},
		{"missing CA file", env("SBX_CA_FILE", "/nonexistent/ca.pem"), "SBX_CA_FILE"},
		{"CA file without a certificate", env("SBX_CA_FILE", notPEM), "no PEM certificate"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := client.FromEnv(tt.env)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("FromEnv: %v, want an error with %q", err, tt.want)
			}
		})
	}
}

// TestTruncationNote: a cut output gets the background shell tool's note, a whole one none.
func TestTruncationNote(t *testing.T) {
	r := client.StartReply{Job: client.Job{OutputPath: "/data/terminals/j.txt"}, OutputTruncated: true, OutputLines: 682, OutputTotalLines: 1000}
	if got, want := r.TruncationNote(), "[showing the last 682 of 1000 lines; the full output is in /data/terminals/j.txt]"; got != want {
		t.Errorf("note %q, want %q", got, want)
	}
	r.OutputTruncated = false
	if got := r.TruncationNote(); got != "" {
		t.Errorf("note of a whole output: %q", got)
	}
}

// deadAddr is the address of a port on 127.0.0.1 that nothing listens on any more.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "http://" + ln.Addr().String()
	ln.Close()
	return addr
}

// TestFailover: with SBX_ADDR listing a dead coordinator first, requests reach the live one; an
// error reply of the first reachable one is returned, not taken as a reason to try another.
func TestFailover(t *testing.T) {
	h := newHarness(t, "")
	h.svc.HandleHeartbeat(&coordinator.Heartbeat{Runner: "r1", Pool: "default", Slots: 2, Version: "t", Boot: time.Now()})
	c, err := client.FromEnv(func(k string) string {
		if k == "SBX_ADDR" {
			return deadAddr(t) + ", " + h.addr
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if runners, err := c.Runners(t.Context()); err != nil || len(runners) != 1 {
			t.Fatalf("runners %+v, %v", runners, err)
		}
	}
	if _, err := c.Job(t.Context(), "nosuchjob"); !isCode(err, "not_found") {
		t.Errorf("job: %v, want not_found", err)
	}

	// A coordinator that answers with an error is not skipped for the next one.
	other := newHarness(t, "the-other-token-of-the-fleet")
	c, err = client.FromEnv(func(k string) string {
		if k == "SBX_ADDR" {
			return other.addr + "," + h.addr
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Runners(t.Context()); !isCode(err, "unauthorized") {
		t.Errorf("runners of a coordinator that refuses: %v, want its unauthorized", err)
	}

	// All dead: the connection error.
	c = client.NewFleet([]string{deadAddr(t), deadAddr(t)}, "")
	var op *net.OpError
	if _, err := c.Runners(t.Context()); !errors.As(err, &op) {
		t.Errorf("runners of dead coordinators: %v, want a connection error", err)
	}
}

func isCode(err error, code string) bool {
	var e *client.Error
	return errors.As(err, &e) && e.Code == code
}
