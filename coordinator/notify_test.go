package coordinator_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/store"
	"github.com/sbx-dev/sbx/proto"
)

// runDispatcher is a fake Dispatcher that can withdraw queued work and records control requests.
type runDispatcher struct {
	mu       sync.Mutex
	seq      uint64
	withdraw bool
	controls []*proto.Control
}

func (d *runDispatcher) Dispatch(context.Context, *proto.Work) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seq++
	return d.seq, nil
}

func (d *runDispatcher) Withdraw(context.Context, uint64) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.withdraw, nil
}

func (d *runDispatcher) Control(_ context.Context, _ string, c *proto.Control) (*proto.ControlReply, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.controls = append(d.controls, c)
	return &proto.ControlReply{V: proto.Version, Code: proto.ReplyOK}, nil
}

func (d *runDispatcher) kills() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ids []string
	for _, c := range d.controls {
		if c.Op == proto.OpKill {
			ids = append(ids, c.JobID)
		}
	}
	return ids
}

// env is a Service on a store in dir, with a settable clock, run until the test ends or stop.
type env struct {
	t    *testing.T
	svc  *coordinator.Service
	clk  *clock
	disp *runDispatcher
	stop func()
}

func testConfig(clk *clock) coordinator.Config {
	return coordinator.Config{
		Now: clk.Now, CheckInterval: 5 * time.Millisecond, NotifyInterval: 2 * time.Millisecond,
		MinDebounce: time.Millisecond, StallAfter: 30 * time.Second, MonitorMaxLines: 5, MonitorWindow: 10 * time.Second,
	}
}

func openEnv(t *testing.T, dir string, clk *clock, cfg coordinator.Config) *env {
	t.Helper()
	db, err := store.Open(filepath.Join(dir, "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	terms, err := store.OpenTerminals(filepath.Join(dir, "terminals"))
	if err != nil {
		t.Fatal(err)
	}
	disp := &runDispatcher{}
	svc, err := coordinator.New(t.Context(), cfg, db, terms, disp)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			terms.Close()
			db.Close()
		})
	}
	t.Cleanup(stop)
	return &env{t: t, svc: svc, clk: clk, disp: disp, stop: stop}
}

func newEnv(t *testing.T, tweak ...func(*coordinator.Config)) *env {
	clk := &clock{now: time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)}
	cfg := testConfig(clk)
	for _, f := range tweak {
		f(&cfg)
	}
	return openEnv(t, t.TempDir(), clk, cfg)
}

// start starts a job and plays its start.
func (e *env) start(req coordinator.StartRequest) string {
	e.t.Helper()
	if req.Cwd == "" {
		req.Cwd = "/"
	}
	if req.Command == "" {
		req.Command = "make test"
	}
	res, err := e.svc.Start(e.t.Context(), req)
	if err != nil {
		e.t.Fatal(err)
	}
	e.event(event(proto.EventStarted, res.Job.ID, e.clk.Now()))
	return res.Job.ID
}

func (e *env) event(ev *proto.Event) {
	e.t.Helper()
	if err := e.svc.HandleEvent(context.Background(), ev); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) chunk(id string, off int64, data string) {
	e.t.Helper()
	if err := e.svc.HandleChunk(context.Background(), &proto.Chunk{JobID: id, Offset: off, Data: []byte(data)}); err != nil {
		e.t.Fatal(err)
	}
}

// exit plays the job's exit with reason and code (code < 0: none).
func (e *env) exit(id, reason string, code int, size int64) {
	e.t.Helper()
	ev := &proto.Event{V: proto.Version, Kind: proto.EventExited, JobID: id, Runner: "r1", Time: e.clk.Now(), Reason: reason, OutputBytes: size}
	if code >= 0 {
		ev.ExitCode = &code
	}
	e.event(ev)
}

// notes returns the session's notifications after seq (all of them: after 0).
func (e *env) notes(session string, after uint64) []*coordinator.Notification {
	e.t.Helper()
	notes, _, err := e.svc.Notifications(e.t.Context(), coordinator.NotificationQuery{Session: session, After: &after})
	if err != nil {
		e.t.Fatal(err)
	}
	return notes
}

// eventually waits up to 5 s for the session to have n notifications.
func (e *env) eventually(session string, n int) []*coordinator.Notification {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		notes := e.notes(session, 0)
		if len(notes) >= n || time.Now().After(deadline) {
			return notes
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func summary(notes []*coordinator.Notification) string {
	var b strings.Builder
	for _, n := range notes {
		fmt.Fprintf(&b, "%d %s %s %q\n", n.Seq, n.Kind, n.Status, n.Detail)
	}
	return b.String()
}

// TestFinished: one finished notification per job, with its status and detail, and only once the
// job ended.
func TestFinished(t *testing.T) {
	tests := []struct {
		reason       string
		code         int
		status, want string
	}{
		{proto.ReasonExit, 0, "success", "exit_code=0"},
		{proto.ReasonExit, 1, "error", "exit_code=1"},
		{proto.ReasonSignal, 137, "error", "exit_code=137"},
		{proto.ReasonKilled, 143, "aborted", "reason=killed exit_code=143"},
		{proto.ReasonTimeout, -1, "aborted", "reason=timeout"},
		{proto.ReasonOOM, 137, "aborted", "reason=oom exit_code=137"},
		{proto.ReasonOutputLimit, -1, "aborted", "reason=output_limit"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s %d", tt.reason, tt.code), func(t *testing.T) {
			e := newEnv(t)
			id := e.start(coordinator.StartRequest{Title: "unit tests"})
			e.chunk(id, 0, "ok\n")
			if notes := e.notes("default", 0); len(notes) != 0 {
				t.Fatalf("notified before the exit:\n%s", summary(notes))
			}
			e.exit(id, tt.reason, tt.code, 3)
			notes := e.notes("default", 0)
			if len(notes) != 1 {
				t.Fatalf("got %d notifications, want 1:\n%s", len(notes), summary(notes))
			}
			n := notes[0]
			if n.Kind != coordinator.KindFinished || n.Status != tt.status || n.Detail != tt.want || n.JobID != id || n.Seq != 1 || n.Title != "unit tests" {
				t.Fatalf("notification %+v, want %s %q", n, tt.status, tt.want)
			}
		})
	}
}

// TestRender: the text is API.md's rendering, byte for byte.
func TestRender(t *testing.T) {
	n := &coordinator.Notification{
		Kind: coordinator.KindFinished, Status: "error", JobID: "123456", Title: "unit tests",
		Detail: "exit_code=1", OutputPath: "/var/lib/sbx/terminals/123456.txt",
	}
	want := `<system_notification>
The following task has finished. If you were already aware, ignore this notification and do not restate prior responses.

<task>
kind: shell
status: error
task_id: 123456
title: unit tests
tool_call_id: 123456
detail: exit_code=1
output_path: /var/lib/sbx/terminals/123456.txt
</task>
</system_notification>
Briefly inform the user about the task result and perform any follow-up actions (if needed).`
	if got := coordinator.Render(n); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	n.Kind, n.Detail, n.OutputPath = coordinator.KindOutput, "", ""
	got := coordinator.Render(n)
	if !strings.Contains(got, "The following task has notified.") || strings.Contains(got, "detail:") || strings.Contains(got, "output_path:") {
		t.Fatalf("output rendering:\n%s", got)
	}
}

// TestSameSecond: five jobs ending in the same second give five notifications.
func TestSameSecond(t *testing.T) {
	e := newEnv(t)
	var ids []string
	for range 5 {
		ids = append(ids, e.start(coordinator.StartRequest{}))
	}
	for _, id := range ids {
		e.exit(id, proto.ReasonExit, 0, 0)
	}
	notes := e.notes("default", 0)
	if len(notes) != 5 {
		t.Fatalf("got %d notifications, want 5:\n%s", len(notes), summary(notes))
	}
	for i, n := range notes {
		if n.Seq != uint64(i+1) || n.JobID != ids[i] {
			t.Fatalf("notification %d: %+v", i, n)
		}
	}
}

// TestObserved: an end seen by a wait or by a blocking start is not notified; a wait that timed
// out before the end does not count.
func TestObserved(t *testing.T) {
	t.Run("wait", func(t *testing.T) {
		e := newEnv(t)
		id := e.start(coordinator.StartRequest{})
		done := make(chan *coordinator.WaitResult)
		go func() {
			w, err := e.svc.Wait(context.Background(), id, 5*time.Second, nil)
			if err != nil {
				t.Error(err)
			}
			done <- w
		}()
		time.Sleep(20 * time.Millisecond)
		e.exit(id, proto.ReasonExit, 0, 0)
		if w := <-done; !w.Done {
			t.Fatalf("wait %+v", w)
		}
		if notes := e.notes("default", 0); len(notes) != 0 {
			t.Fatalf("a waited-for job notified:\n%s", summary(notes))
		}
	})
	t.Run("block_until_ms", func(t *testing.T) {
		e := newEnv(t)
		go func() {
			for {
				jobs, _ := e.svc.Jobs(context.Background(), coordinator.JobFilter{})
				if len(jobs) > 0 {
					e.svc.HandleEvent(context.Background(), event(proto.EventStarted, jobs[0].ID, e.clk.Now()))
					code := 1
					e.svc.HandleEvent(context.Background(), &proto.Event{V: proto.Version, Kind: proto.EventExited, JobID: jobs[0].ID, Runner: "r1", Time: e.clk.Now(), Reason: proto.ReasonExit, ExitCode: &code})
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
		res, err := e.svc.Start(t.Context(), coordinator.StartRequest{Command: "false", Cwd: "/", BlockUntil: 5 * time.Second})
		if err != nil || res.Backgrounded || res.Job.Status != coordinator.StatusFailed {
			t.Fatalf("start: %+v, %v", res, err)
		}
		if notes := e.notes("default", 0); len(notes) != 0 {
			t.Fatalf("a job that ended within block_until_ms notified:\n%s", summary(notes))
		}
	})
	t.Run("wait timed out", func(t *testing.T) {
		e := newEnv(t)
		id := e.start(coordinator.StartRequest{})
		if w, err := e.svc.Wait(t.Context(), id, 10*time.Millisecond, nil); err != nil || w.Done {
			t.Fatalf("wait %+v, %v", w, err)
		}
		e.exit(id, proto.ReasonExit, 0, 0)
		if notes := e.notes("default", 0); len(notes) != 1 {
			t.Fatalf("got %d notifications, want 1:\n%s", len(notes), summary(notes))
		}
	})
	t.Run("waiter went away", func(t *testing.T) {
		e := newEnv(t)
		id := e.start(coordinator.StartRequest{})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			e.svc.Wait(ctx, id, 5*time.Second, nil)
		}()
		time.Sleep(20 * time.Millisecond)
		// The end is applied while the wait is counted, but the waiter leaves without seeing it.
		cancel()
		e.exit(id, proto.ReasonExit, 0, 0)
		<-done
		if notes := e.eventually("default", 1); len(notes) != 1 || notes[0].Kind != coordinator.KindFinished {
			t.Fatalf("want the finished notification, got:\n%s", summary(notes))
		}
	})
}

// TestOutputDebounce: the first match notifies at once, later ones in the window are counted into
// one notification, flushed before the finished one.
func TestOutputDebounce(t *testing.T) {
	e := newEnv(t)
	id := e.start(coordinator.StartRequest{NotifyOnOutput: &coordinator.OutputNotify{Pattern: `^ERROR`, Reason: "an error"}})
	var out strings.Builder
	for i := range 20 {
		fmt.Fprintf(&out, "ok %d\r\nERROR %d\r\n", i, i)
	}
	// In three chunks, split inside lines.
	s := out.String()
	e.chunk(id, 0, s[:7])
	e.chunk(id, 7, s[7:100])
	e.chunk(id, 100, s[100:])
	notes := e.notes("default", 0)
	if len(notes) != 1 || notes[0].Kind != coordinator.KindOutput || notes[0].Detail != "an error (occurrence 1): ERROR 0" {
		t.Fatalf("after the output:\n%s", summary(notes))
	}
	e.exit(id, proto.ReasonExit, 0, int64(len(s)))
	notes = e.notes("default", 0)
	want := `1 output success "an error (occurrence 1): ERROR 0"
2 output success "an error: 19 more times since the previous notification; latest (occurrence 20): ERROR 19"
3 finished success "exit_code=0"
`
	if got := summary(notes); got != want {
		t.Fatalf("got\n%swant\n%s", got, want)
	}
	if !strings.Contains(notes[1].Text, "has notified") {
		t.Fatalf("text: %s", notes[1].Text)
	}
}

// TestOutputWindow: a window that closes sends what it counted; after a quiet window the next match
// notifies at once; a partial last line is matched at the end.
func TestOutputWindow(t *testing.T) {
	e := newEnv(t)
	id := e.start(coordinator.StartRequest{NotifyOnOutput: &coordinator.OutputNotify{Pattern: `fail`, DebounceMS: 1000}})
	e.chunk(id, 0, "fail 1\nfail 2\nfail 3\n")
	e.clk.advance(1500 * time.Millisecond)
	e.eventually("default", 2)
	e.clk.advance(1500 * time.Millisecond) // a quiet window: closed with nothing to send
	time.Sleep(20 * time.Millisecond)
	e.chunk(id, 21, "fail 4\nfail 5")
	e.exit(id, proto.ReasonExit, 2, 34)
	want := `1 output success "fail (occurrence 1): fail 1"
2 output success "fail: 2 more times since the previous notification; latest (occurrence 3): fail 3"
3 output success "fail (occurrence 4): fail 4"
4 output success "fail: 1 more time since the previous notification; latest (occurrence 5): fail 5"
5 finished error "exit_code=2"
`
	if got := summary(e.notes("default", 0)); got != want {
		t.Fatalf("got\n%swant\n%s", got, want)
	}
}

// TestOutputLimit: after 100 matches, one limit notice and nothing more.
func TestOutputLimit(t *testing.T) {
	e := newEnv(t)
	id := e.start(coordinator.StartRequest{NotifyOnOutput: &coordinator.OutputNotify{Pattern: `x`}})
	var off int64
	for i := range 150 {
		line := fmt.Sprintf("x%d\n", i)
		e.chunk(id, off, line)
		off += int64(len(line))
	}
	e.exit(id, proto.ReasonExit, 0, off)
	want := `1 output success "x (occurrence 1): x0"
2 output success "x: 99 more times since the previous notification; latest (occurrence 100): x99"
3 limit aborted "x: Notification limit reached (100); further matches are not notified."
4 finished success "exit_code=0"
`
	if got := summary(e.notes("default", 0)); got != want {
		t.Fatalf("got\n%swant\n%s", got, want)
	}
}

// TestOutputOutOfOrder: a chunk beyond a gap is matched only once the gap is filled, in order, and
// a long matched line is named by its length.
func TestOutputOutOfOrder(t *testing.T) {
	e := newEnv(t)
	id := e.start(coordinator.StartRequest{NotifyOnOutput: &coordinator.OutputNotify{Pattern: `^(a|b|L)`}})
	long := "L" + strings.Repeat("-", 6000) + "\n"
	e.chunk(id, 4, "b 2\n"+long)
	if notes := e.notes("default", 0); len(notes) != 0 {
		t.Fatalf("matched past a gap:\n%s", summary(notes))
	}
	e.chunk(id, 0, "a 1\n")
	e.exit(id, proto.ReasonExit, 0, int64(8+len(long)))
	want := `1 output success "^(a|b|L) (occurrence 1): a 1"
2 output success "^(a|b|L): 2 more times since the previous notification; latest (occurrence 3): (a matched line of 6001 characters)"
3 finished success "exit_code=0"
`
	if got := summary(e.notes("default", 0)); got != want {
		t.Fatalf("got\n%swant\n%s", got, want)
	}
}

// TestStall: output unchanged with a prompt as its last line notifies once per stall, and the
// job's end still notifies.
func TestStall(t *testing.T) {
	e := newEnv(t, func(c *coordinator.Config) { c.RunnerDeadline = 24 * time.Hour })
	id := e.start(coordinator.StartRequest{})
	e.chunk(id, 0, "working\n")
	e.clk.advance(time.Minute)
	time.Sleep(30 * time.Millisecond)
	if notes := e.notes("default", 0); len(notes) != 0 {
		t.Fatalf("a stall without a prompt notified:\n%s", summary(notes))
	}
	e.chunk(id, 8, "Overwrite config.yml? [y/N] ")
	e.clk.advance(31 * time.Second)
	notes := e.eventually("default", 1)
	if len(notes) != 1 || notes[0].Kind != coordinator.KindStall || !strings.Contains(notes[0].Detail, "working\nOverwrite config.yml? [y/N]") {
		t.Fatalf("stall:\n%s", summary(notes))
	}
	e.clk.advance(time.Minute)
	time.Sleep(30 * time.Millisecond)
	e.chunk(id, 36, "\nAre you sure? ")
	e.clk.advance(31 * time.Second)
	e.eventually("default", 2)
	e.exit(id, proto.ReasonExit, 0, 51)
	want := "stall error\nstall error\nfinished success\n"
	var got string
	for _, n := range e.notes("default", 0) {
		got += string(n.Kind) + " " + n.Status + "\n"
	}
	if got != want {
		t.Fatalf("got\n%swant\n%s", got, want)
	}
}

// TestMonitor: every line is delivered, batched per chunk; a monitor over its rate is stopped with
// a notice; a monitor gets the default timeout unless persistent.
func TestMonitor(t *testing.T) {
	e := newEnv(t)
	id := e.start(coordinator.StartRequest{Monitor: true})
	e.chunk(id, 0, "one\ntwo\nthr")
	e.chunk(id, 11, "ee\n")
	notes := e.notes("default", 0)
	if got := summary(notes); got != "1 monitor success \"one\\ntwo\"\n2 monitor success \"three\"\n" {
		t.Fatalf("got\n%s", got)
	}
	e.chunk(id, 14, "4\n5\n6\n7\n")
	notes = e.notes("default", 2)
	if got := summary(notes); got != "3 monitor success \"4\\n5\"\n4 limit aborted \"Monitor stopped: more than 5 lines in 10s; restart with a tighter filter.\"\n" {
		t.Fatalf("got\n%s", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(e.disp.kills()) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if kills := e.disp.kills(); len(kills) != 1 || kills[0] != id {
		t.Fatalf("kills %v", kills)
	}
	j, _ := e.svc.Job(t.Context(), id)
	if j.Limits.TimeoutMS != (30 * time.Minute).Milliseconds() {
		t.Fatalf("monitor timeout %d", j.Limits.TimeoutMS)
	}
	res, err := e.svc.Start(t.Context(), coordinator.StartRequest{Command: "tail -f x", Cwd: "/", Monitor: true, Persistent: true})
	if err != nil || res.Job.Limits.TimeoutMS != 0 {
		t.Fatalf("persistent monitor: %+v, %v", res, err)
	}
}

// TestSessionEnd: ending a session stops its jobs, queued or running, as session_ended, with no
// notification; other sessions are untouched.
func TestSessionEnd(t *testing.T) {
	e := newEnv(t)
	running := e.start(coordinator.StartRequest{Session: "s1", NotifyOnOutput: &coordinator.OutputNotify{Pattern: "x"}})
	e.event(&proto.Event{V: proto.Version, Kind: proto.EventAccepted, JobID: running, Runner: "r1", Time: e.clk.Now()})
	other := e.start(coordinator.StartRequest{Session: "s2"})
	e.disp.withdraw = true
	queued, err := e.svc.Start(t.Context(), coordinator.StartRequest{Command: "sleep 1", Cwd: "/", Session: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := e.svc.EndSession(t.Context(), "s1")
	if err != nil || len(ids) != 2 {
		t.Fatalf("end session: %v, %v", ids, err)
	}
	if kills := e.disp.kills(); len(kills) != 1 || kills[0] != running {
		t.Fatalf("kills %v, want %s", kills, running)
	}
	e.chunk(running, 0, "x\n")
	e.exit(running, proto.ReasonKilled, 143, 2)
	for _, id := range []string{running, queued.Job.ID} {
		j, _ := e.svc.Job(t.Context(), id)
		if j.Status != coordinator.StatusAborted || j.Reason != proto.ReasonSessionEnded {
			t.Fatalf("job %s: %s %s", id, j.Status, j.Reason)
		}
	}
	if notes := e.notes("s1", 0); len(notes) != 0 {
		t.Fatalf("an ended session notified:\n%s", summary(notes))
	}
	e.exit(other, proto.ReasonExit, 0, 0)
	if notes := e.notes("s2", 0); len(notes) != 1 {
		t.Fatalf("s2: %s", summary(notes))
	}
	if _, err := e.svc.EndSession(t.Context(), "nope"); coordinator.ErrorCode(err) != coordinator.ENOTFOUND {
		t.Fatalf("unknown session: %v", err)
	}
}

// TestLease: a session whose lease is not renewed ends, stopping its jobs; renewing keeps it.
func TestLease(t *testing.T) {
	e := newEnv(t)
	if _, err := e.svc.OpenSession(t.Context(), "agent", time.Second); err != nil {
		t.Fatal(err)
	}
	id := e.start(coordinator.StartRequest{Session: "agent"})
	e.event(&proto.Event{V: proto.Version, Kind: proto.EventAccepted, JobID: id, Runner: "r1", Time: e.clk.Now()})
	for range 3 {
		e.clk.advance(600 * time.Millisecond)
		e.svc.TouchSession("agent")
		time.Sleep(20 * time.Millisecond)
	}
	if kills := e.disp.kills(); len(kills) != 0 {
		t.Fatalf("a renewed session ended: %v", kills)
	}
	e.clk.advance(1100 * time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for len(e.disp.kills()) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if kills := e.disp.kills(); len(kills) != 1 || kills[0] != id {
		t.Fatalf("kills %v", kills)
	}
	st, err := e.svc.Session(t.Context(), "agent")
	if err != nil || st.EndedAt == nil {
		t.Fatalf("session %+v, %v", st, err)
	}
}

// TestRestart: notifications survive a restart, the acked cursor too, and seqs go on.
func TestRestart(t *testing.T) {
	dir := t.TempDir()
	clk := &clock{now: time.Now()}
	e := openEnv(t, dir, clk, testConfig(clk))
	var ids []string
	for range 3 {
		ids = append(ids, e.start(coordinator.StartRequest{}))
	}
	e.exit(ids[0], proto.ReasonExit, 0, 0)
	e.exit(ids[1], proto.ReasonExit, 0, 0)
	if _, err := e.svc.Ack(t.Context(), "default", 1); err != nil {
		t.Fatal(err)
	}
	e.stop()

	e = openEnv(t, dir, clk, testConfig(clk))
	// The exit of job 1 is delivered again (acked late), then job 2 ends.
	e.exit(ids[1], proto.ReasonExit, 0, 0)
	e.exit(ids[2], proto.ReasonExit, 1, 0)
	notes, next, err := e.svc.Notifications(t.Context(), coordinator.NotificationQuery{Session: "default"})
	if err != nil {
		t.Fatal(err)
	}
	if len(notes) != 2 || notes[0].Seq != 2 || notes[0].JobID != ids[1] || notes[1].Seq != 3 || notes[1].JobID != ids[2] || next != 3 {
		t.Fatalf("after restart (next %d):\n%s", next, summary(notes))
	}
}

// TestNotificationsRead: long-poll, the cursor, and bad input.
func TestNotificationsRead(t *testing.T) {
	e := newEnv(t)
	id := e.start(coordinator.StartRequest{Session: "s"})
	got := make(chan []*coordinator.Notification)
	go func() {
		notes, _, err := e.svc.Notifications(context.Background(), coordinator.NotificationQuery{Session: "s", Wait: 5 * time.Second})
		if err != nil {
			t.Error(err)
		}
		got <- notes
	}()
	time.Sleep(20 * time.Millisecond)
	e.exit(id, proto.ReasonExit, 0, 0)
	if notes := <-got; len(notes) != 1 || notes[0].JobID != id {
		t.Fatalf("long-poll: %s", summary(notes))
	}
	ctx := t.Context()
	if st, err := e.svc.Ack(ctx, "s", 1); err != nil || st.Acked != 1 {
		t.Fatalf("ack: %+v, %v", st, err)
	}
	if st, err := e.svc.Ack(ctx, "s", 0); err != nil || st.Acked != 1 {
		t.Fatalf("ack backwards: %+v, %v", st, err)
	}
	notes, next, err := e.svc.Notifications(ctx, coordinator.NotificationQuery{Session: "s"})
	if err != nil || len(notes) != 0 || next != 1 {
		t.Fatalf("after the ack: %v, %d, %v", notes, next, err)
	}
	future := uint64(2)
	bad := []struct {
		name string
		err  error
		code string
		want string
	}{
		{"after in the future", third(e.svc.Notifications(ctx, coordinator.NotificationQuery{Session: "s", After: &future})), coordinator.EINVALID, "after 2"},
		{"ack beyond", second(e.svc.Ack(ctx, "s", 2)), coordinator.EINVALID, "seq 2"},
		{"ack unknown", second(e.svc.Ack(ctx, "nope", 1)), coordinator.ENOTFOUND, `"nope"`},
		{"bad regex", second(e.svc.Start(ctx, coordinator.StartRequest{Command: "x", Cwd: "/", NotifyOnOutput: &coordinator.OutputNotify{Pattern: "("}})), coordinator.EINVALID, "notify_on_output.pattern"},
		{"long pattern", second(e.svc.Start(ctx, coordinator.StartRequest{Command: "x", Cwd: "/", NotifyOnOutput: &coordinator.OutputNotify{Pattern: strings.Repeat("a", 501)}})), coordinator.EINVALID, "notify_on_output.pattern"},
		{"long reason", second(e.svc.Start(ctx, coordinator.StartRequest{Command: "x", Cwd: "/", NotifyOnOutput: &coordinator.OutputNotify{Pattern: "a", Reason: strings.Repeat("é", 501)}})), coordinator.EINVALID, "notify_on_output.reason"},
		{"negative debounce", second(e.svc.Start(ctx, coordinator.StartRequest{Command: "x", Cwd: "/", NotifyOnOutput: &coordinator.OutputNotify{Pattern: "a", DebounceMS: -1}})), coordinator.EINVALID, "notify_on_output.debounce_ms"},
		{"persistent alone", second(e.svc.Start(ctx, coordinator.StartRequest{Command: "x", Cwd: "/", Persistent: true})), coordinator.EINVALID, "persistent"},
		{"short lease", second(e.svc.OpenSession(ctx, "s", time.Millisecond)), coordinator.EINVALID, "lease_ms"},
	}
	for _, b := range bad {
		if coordinator.ErrorCode(b.err) != b.code || !strings.Contains(coordinator.ErrorMessage(b.err), b.want) {
			t.Errorf("%s: %v, want %s naming %s", b.name, b.err, b.code, b.want)
		}
	}
}

func second[T any](_ T, err error) error { return err }

func third[T, U any](_ T, _ U, err error) error { return err }
