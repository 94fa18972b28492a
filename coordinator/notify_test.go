package coordinator_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/coordinatortest"
	"github.com/sbx-dev/sbx/coordinator/store"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
)

// env is a Service on a store in dir, with a settable clock, run until the test ends or stop.
type env struct {
	t    *testing.T
	svc  *coordinator.Service
	clk  *clock
	disp *coordinatortest.Dispatcher
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
	disp := &coordinatortest.Dispatcher{}
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

func (e *env) event(ev *coordinator.Event) {
	e.t.Helper()
	if err := e.svc.HandleEvent(context.Background(), coordinatortest.Claimed(e.svc, ev)); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) chunk(id string, off int64, data string) {
	e.t.Helper()
	if err := e.svc.HandleChunk(context.Background(), coordinatortest.ClaimedChunk(e.svc, &coordinator.Chunk{JobID: id, Offset: off, Data: []byte(data)})); err != nil {
		e.t.Fatal(err)
	}
}

// exit plays the job's exit with reason and code (code < 0: none).
func (e *env) exit(id, reason string, code int, size int64) {
	e.t.Helper()
	e.event(exitEvent(id, reason, code, size, e.clk.Now()))
}

// exitEvent is the exit event of a job with reason and code (code < 0: none) after size bytes.
func exitEvent(id, reason string, code int, size int64, at time.Time) *coordinator.Event {
	ev := &coordinator.Event{Kind: proto.EventExited, JobID: id, Runner: "r1", Time: at, Reason: reason, OutputBytes: size}
	if code >= 0 {
		ev.ExitCode = &code
	}
	return ev
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
	var notes []*coordinator.Notification
	poll.Within(5*time.Second, func() bool {
		notes = e.notes(session, 0)
		return len(notes) >= n
	})
	return notes
}

// wantNotes checks the default session's notifications against want (as summary writes them) and
// returns them.
func (e *env) wantNotes(want string) []*coordinator.Notification {
	e.t.Helper()
	notes := e.notes("default", 0)
	if got := summary(notes); got != want {
		e.t.Fatalf("got\n%swant\n%s", got, want)
	}
	return notes
}

func summary(notes []*coordinator.Notification) string {
	var b strings.Builder
	for _, n := range notes {
		fmt.Fprintf(&b, "%d %s %s %q\n", n.Seq, n.Kind, n.Status, n.Detail)
	}
	return b.String()
}

// TestFinished: one finished notification per job, with its status and detail, and only once the
// job ended. A success has no detail; a job stopped from outside (a kill, a signal, a limit) is
// aborted and says why.
func TestFinished(t *testing.T) {
	tests := []struct {
		reason, why  string
		code, signal int
		status, want string
		summary      string
	}{
		{proto.ReasonExit, "", 0, 0, "success", "", `Async command "unit tests" completed (exit code 0)`},
		{proto.ReasonExit, "", 1, 0, "error", "exit_code=1", `Async command "unit tests" failed with exit code 1`},
		{proto.ReasonSignal, "", 139, 11, "aborted", "reason=signal signal=SIGSEGV", `Async command "unit tests" was stopped`},
		{proto.ReasonKilled, "killed on request", 143, 15, "aborted", "reason=killed (killed on request)", `Async command "unit tests" was stopped`},
		{proto.ReasonTimeout, "timed out after 1000 ms", -1, 0, "aborted", "reason=timeout (timed out after 1000 ms)", `Async command "unit tests" was stopped`},
		{proto.ReasonOOM, "the memory limit was reached", 137, 9, "aborted", "reason=oom (the memory limit was reached)", `Async command "unit tests" was stopped`},
		{proto.ReasonOutputLimit, "", -1, 0, "aborted", "reason=output_limit", `Async command "unit tests" was stopped`},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s %d", tt.reason, tt.code), func(t *testing.T) {
			e := newEnv(t)
			id := e.start(coordinator.StartRequest{Title: "unit tests"})
			e.chunk(id, 0, "ok\n")
			if notes := e.notes("default", 0); len(notes) != 0 {
				t.Fatalf("notified before the exit:\n%s", summary(notes))
			}
			ev := exitEvent(id, tt.reason, tt.code, 3, e.clk.Now())
			ev.Signal, ev.Error = tt.signal, tt.why
			e.event(ev)
			notes := e.notes("default", 0)
			if len(notes) != 1 {
				t.Fatalf("got %d notifications, want 1:\n%s", len(notes), summary(notes))
			}
			n := notes[0]
			if n.Kind != coordinator.KindFinished || n.Status != tt.status || n.Detail != tt.want || n.JobID != id || n.Seq != 1 || n.Title != "unit tests" || n.Summary != tt.summary {
				t.Fatalf("notification %+v, want %s %q %q", n, tt.status, tt.want, tt.summary)
			}
			// The text shows a failure's detail only, and no output_path: the JSON keeps an abort's reason.
			if hasDetail := strings.Contains(n.Text, "\ndetail: "); hasDetail != (tt.status == "error") || strings.Contains(n.Text, "output_path:") {
				t.Fatalf("text:\n%s", n.Text)
			}
			j, _ := e.svc.Job(t.Context(), id)
			if want := map[string]coordinator.Status{"success": coordinator.StatusSucceeded, "error": coordinator.StatusFailed, "aborted": coordinator.StatusAborted}[tt.status]; j.Status != want {
				t.Fatalf("job status %s, want %s", j.Status, want)
			}
		})
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
		poll.Until(t, 5*time.Second, "the wait is counted", func() bool { return e.svc.Observers(id) == 1 })
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
			var jobs []*coordinator.Job
			if !poll.Within(5*time.Second, func() bool {
				jobs, _ = e.svc.Jobs(context.Background(), coordinator.JobFilter{})
				return len(jobs) > 0
			}) {
				return // the blocking start fails the test
			}
			e.svc.HandleEvent(context.Background(), coordinatortest.Claimed(e.svc, event(proto.EventStarted, jobs[0].ID, e.clk.Now())))
			code := 1
			e.svc.HandleEvent(context.Background(), coordinatortest.Claimed(e.svc, &coordinator.Event{Kind: proto.EventExited, JobID: jobs[0].ID, Runner: "r1", Time: e.clk.Now(), Reason: proto.ReasonExit, ExitCode: &code}))
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
		poll.Until(t, 5*time.Second, "the wait is counted", func() bool { return e.svc.Observers(id) == 1 })
		// The end is applied while the wait is counted, but the waiter leaves without seeing it.
		cancel()
		e.exit(id, proto.ReasonExit, 0, 0)
		<-done
		if notes := e.eventually("default", 1); len(notes) != 1 || notes[0].Kind != coordinator.KindFinished {
			t.Fatalf("want the finished notification, got:\n%s", summary(notes))
		}
	})
	// A kill asked for by the job's own session is the agent's doing: its end notifies nothing. One
	// from another session, or a signal that is no stop, leaves the end to notify.
	for _, tc := range []struct {
		name, session, signal string
		notes                 int
	}{
		{"kill from its own session", "default", "", 0},
		{"KILL from its own session", "default", "KILL", 0},
		{"kill from another session", "other", "", 1},
		{"kill from no session", "", "", 1},
		{"HUP from its own session", "default", "HUP", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			id := e.start(coordinator.StartRequest{})
			if err := e.svc.KillFrom(t.Context(), tc.session, id, tc.signal); err != nil {
				t.Fatal(err)
			}
			e.exit(id, proto.ReasonKilled, 143, 0)
			if notes := e.notes("default", 0); len(notes) != tc.notes {
				t.Fatalf("got %d notifications, want %d:\n%s", len(notes), tc.notes, summary(notes))
			}
			if j, _ := e.svc.Job(t.Context(), id); j.Observed != (tc.notes == 0) {
				t.Fatalf("job observed %v", j.Observed)
			}
		})
	}
}

// TestOutputDebounce: the first match notifies at once, later ones in the window are counted into
// one notification, flushed before the finished one. The texts are Cursor's, titled with the reason.
func TestOutputDebounce(t *testing.T) {
	e := newEnv(t)
	id := e.start(coordinator.StartRequest{NotifyOnOutput: &coordinator.OutputNotify{Pattern: `^ERROR \d+`, Reason: "an error"}})
	var out strings.Builder
	for i := range 20 {
		fmt.Fprintf(&out, "ok %d\r\nERROR %d: boom\r\n", i, i)
	}
	// In three chunks, split inside lines.
	s := out.String()
	e.chunk(id, 0, s[:7])
	e.chunk(id, 7, s[7:100])
	e.chunk(id, 100, s[100:])
	first := "Shell output has pattern /^ERROR \\d+/. This is occurrence number 1. Matched text: ERROR 0. The title message is being displayed to the user."
	notes := e.notes("default", 0)
	if len(notes) != 1 || notes[0].Kind != coordinator.KindOutput || notes[0].Detail != first {
		t.Fatalf("after the output:\n%s", summary(notes))
	}
	e.exit(id, proto.ReasonExit, 0, int64(len(s)))
	want := `1 output success "Shell output has pattern /^ERROR \\d+/. This is occurrence number 1. Matched text: ERROR 0. The title message is being displayed to the user."
2 output success "Shell output matched /^ERROR \\d+/ 19 more times since the previous notification. The title message is being displayed to the user. Latest match: ERROR 19."
3 finished success ""
`
	notes = e.wantNotes(want)
	for _, n := range notes[:2] {
		if n.Title != "an error" || n.Summary != `Monitor event: "an error"` || n.Event != n.Detail || !strings.Contains(n.Text, "has notified") || !strings.Contains(n.Text, "\ntitle: an error\n") {
			t.Fatalf("notification %+v", n)
		}
	}
}

// TestOutputStream: the pattern is matched over the stream, as pi-pstack's output watch matches
// it: a match may span lines and chunks, counts once, and quotes what it spans; ^ and $ match at line
// boundaries.
func TestOutputStream(t *testing.T) {
	e := newEnv(t)
	id := e.start(coordinator.StartRequest{NotifyOnOutput: &coordinator.OutputNotify{Pattern: `(?s)^panic: [^\n]*\n\ngoroutine \d+`, Reason: "panic"}})
	out := "ok\npanic: boom\n\ngoroutine 7 [running]:\nmain.main()\n"
	// Split inside the panic, so that no chunk holds the whole match.
	e.chunk(id, 0, out[:12])
	e.chunk(id, 12, out[12:22])
	e.chunk(id, 22, out[22:])
	e.exit(id, proto.ReasonExit, 2, int64(len(out)))
	e.wantNotes(`1 output success "Shell output has pattern /(?s)^panic: [^\\n]*\\n\\ngoroutine \\d+/. This is occurrence number 1. Matched text: panic: boom\n\ngoroutine 7. The title message is being displayed to the user."
2 finished error "exit_code=2"
`)
}

// TestOutputWindow: a window that closes sends what it counted; after a quiet window the next match
// notifies at once; a partial last line is matched at the end. Without a reason the title names
// the pattern.
func TestOutputWindow(t *testing.T) {
	e := newEnv(t)
	id := e.start(coordinator.StartRequest{NotifyOnOutput: &coordinator.OutputNotify{Pattern: `fail \d`, DebounceMS: 1000}})
	e.chunk(id, 0, "fail 1\nfail 2\nfail 3\n")
	e.clk.advance(1500 * time.Millisecond)
	e.eventually("default", 2)
	e.clk.advance(1500 * time.Millisecond) // a quiet window: closed with nothing to send
	// Let the check loop (every 5 ms) close it: nothing shows that it did.
	time.Sleep(20 * time.Millisecond)
	e.chunk(id, 21, "fail 4\nfail 5")
	e.exit(id, proto.ReasonExit, 2, 34)
	want := `1 output success "Shell output has pattern /fail \\d/. This is occurrence number 1. Matched text: fail 1. The title message is being displayed to the user."
2 output success "Shell output matched /fail \\d/ 2 more times since the previous notification. The title message is being displayed to the user. Latest match: fail 3."
3 output success "Shell output has pattern /fail \\d/. This is occurrence number 4. Latest match: fail 4. The title message is being displayed to the user."
4 output success "Shell output has pattern /fail \\d/. This is occurrence number 5. Latest match: fail 5. The title message is being displayed to the user."
5 finished error "exit_code=2"
`
	notes := e.wantNotes(want)
	if notes[0].Title != `Shell output contains /fail \d/` || notes[4].Title != "make test" {
		t.Fatalf("titles %q, %q", notes[0].Title, notes[4].Title)
	}
}

// TestOutputLimit: the 100th match brings the limit notice with it (not the 101st), and nothing
// more is notified.
func TestOutputLimit(t *testing.T) {
	for _, n := range []int{100, 150} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			e := newEnv(t)
			id := e.start(coordinator.StartRequest{NotifyOnOutput: &coordinator.OutputNotify{Pattern: `x\d+`, Reason: "x"}})
			var off int64
			for i := range n {
				line := fmt.Sprintf("x%d\n", i)
				e.chunk(id, off, line)
				off += int64(len(line))
				if i == 99 {
					// The notice is there at the 100th match, before the window closes or the job ends.
					if got := e.notes("default", 0); len(got) != 3 || got[2].Kind != coordinator.KindLimit {
						t.Fatalf("after the 100th match:\n%s", summary(got))
					}
				}
			}
			e.exit(id, proto.ReasonExit, 0, off)
			want := `1 output success "Shell output has pattern /x\\d+/. This is occurrence number 1. Matched text: x0. The title message is being displayed to the user."
2 output success "Shell output matched /x\\d+/ 99 more times since the previous notification. The title message is being displayed to the user. Latest match: x99."
3 limit success "Shell output matched /x\\d+/ 100 times and has reached the notification limit. No further notifications will be sent for this pattern. To continue monitoring, read the output file directly at the output path."
4 finished success ""
`
			notes := e.wantNotes(want)
			if notes[2].Title != "Notification limit reached (100)" {
				t.Fatalf("limit title %q", notes[2].Title)
			}
		})
	}
}

// TestOutputOutOfOrder: a chunk beyond a gap is matched only once the gap is filled, in order, and
// a long matched text is named by its length.
func TestOutputOutOfOrder(t *testing.T) {
	e := newEnv(t)
	id := e.start(coordinator.StartRequest{NotifyOnOutput: &coordinator.OutputNotify{Pattern: `^(a|b|L.*)`}})
	long := "L" + strings.Repeat("-", 6000) + "\n"
	e.chunk(id, 4, "b 2\n"+long)
	if notes := e.notes("default", 0); len(notes) != 0 {
		t.Fatalf("matched past a gap:\n%s", summary(notes))
	}
	e.chunk(id, 0, "a 1\n")
	e.exit(id, proto.ReasonExit, 0, int64(8+len(long)))
	want := `1 output success "Shell output has pattern /^(a|b|L.*)/. This is occurrence number 1. Matched text: a. The title message is being displayed to the user."
2 output success "Shell output matched /^(a|b|L.*)/ 2 more times since the previous notification. The title message is being displayed to the user. Latest match is 6001 characters; omitted from notification detail."
3 finished success ""
`
	e.wantNotes(want)
}

// TestStall: output unchanged with a prompt as its last line notifies once per job (a later
// prompt does not notify again), and the job's end still notifies; a monitor never stalls.
func TestStall(t *testing.T) {
	e := newEnv(t, func(c *coordinator.Config) { c.RunnerDeadline = 24 * time.Hour })
	id := e.start(coordinator.StartRequest{Title: "init"})
	e.chunk(id, 0, "working\n")
	e.clk.advance(time.Minute)
	time.Sleep(30 * time.Millisecond) // the check loop's runs in which no stall may be notified
	if notes := e.notes("default", 0); len(notes) != 0 {
		t.Fatalf("a stall without a prompt notified:\n%s", summary(notes))
	}
	e.chunk(id, 8, "Overwrite config.yml? [y/N] ")
	e.clk.advance(31 * time.Second)
	notes := e.eventually("default", 1)
	if len(notes) != 1 || notes[0].Kind != coordinator.KindStall || !strings.Contains(notes[0].Detail, "Last output:\nworking\nOverwrite config.yml? [y/N]\n\nThe command is likely blocked") ||
		notes[0].Summary != `Async command "init" appears to be waiting for interactive input` || notes[0].Event != "working\nOverwrite config.yml? [y/N]" {
		t.Fatalf("stall: %+v", notes)
	}
	// The sleeps below let the check loop run on the clock just set: in those runs the same prompt,
	// a later one, and a monitor's prompt may not notify a stall.
	e.clk.advance(time.Minute)
	time.Sleep(30 * time.Millisecond)
	e.chunk(id, 36, "\nAre you sure? ")
	e.clk.advance(31 * time.Second)
	time.Sleep(50 * time.Millisecond)

	mon := e.start(coordinator.StartRequest{Monitor: true})
	e.chunk(mon, 0, "Do you want to continue?\n")
	e.clk.advance(time.Minute)
	time.Sleep(50 * time.Millisecond)

	e.exit(id, proto.ReasonExit, 0, 51)
	want := "stall error " + id + "\nmonitor success " + mon + "\nfinished success " + id + "\n"
	var got string
	for _, n := range e.notes("default", 0) {
		got += string(n.Kind) + " " + n.Status + " " + n.JobID + "\n"
	}
	if got != want {
		t.Fatalf("got\n%swant\n%s", got, want)
	}
}

// TestStallPrompts: the last lines that look like a prompt, Claude Code's among them, and some that
// do not.
func TestStallPrompts(t *testing.T) {
	prompts := map[string]bool{
		"Do you want to install these packages?":   true,
		"Would you like to use TypeScript? › No":   false,
		"Would you like to use TypeScript?":        true,
		"Shall I overwrite the lock file? ":        true,
		"Ready to deploy to production?":           true,
		"Are you sure you want to delete it? ":     true,
		"Proceed (y/n)":                            true,
		"Continue? [Y/n]":                          true,
		"Press Enter to continue":                  true,
		"Enter passphrase for key '/root/.ssh/x':": true,
		"Do you know what this does":               false,
		"compiled 12 files, ready to serve":        false,
		"tests passed":                             false,
	}
	for line, want := range prompts {
		t.Run(line, func(t *testing.T) {
			e := newEnv(t, func(c *coordinator.Config) { c.RunnerDeadline = 24 * time.Hour })
			id := e.start(coordinator.StartRequest{})
			e.chunk(id, 0, "building\n"+line)
			e.clk.advance(31 * time.Second)
			if want {
				e.eventually("default", 1)
			} else {
				time.Sleep(30 * time.Millisecond) // the check loop's runs in which no stall may be notified
			}
			if got := len(e.notes("default", 0)) == 1; got != want {
				t.Fatalf("stalled %v, want %v", got, want)
			}
		})
	}
}

// TestMonitor: every line is delivered, batched per chunk; a monitor over its rate is stopped with
// one terminal notice (its end adds no finished notification); a monitor gets the default timeout
// unless persistent.
func TestMonitor(t *testing.T) {
	e := newEnv(t)
	id := e.start(coordinator.StartRequest{Monitor: true, Title: "errors in deploy.log"})
	e.chunk(id, 0, "one\ntwo\nthr")
	e.chunk(id, 11, "ee\n")
	notes := e.notes("default", 0)
	if got := summary(notes); got != "1 monitor success \"one\\ntwo\"\n2 monitor success \"three\"\n" {
		t.Fatalf("got\n%s", got)
	}
	if n := notes[0]; n.Summary != `Monitor event: "errors in deploy.log"` || n.Event != "one\ntwo" {
		t.Fatalf("monitor notification %+v", n)
	}
	e.chunk(id, 14, "4\n5\n6\n7\n")
	stop := "[Monitor stopped — too much output (more than 5 lines in 10s). Restart with a more selective source.]"
	notes = e.notes("default", 2)
	if got := summary(notes); got != "3 monitor success \"4\\n5\"\n4 limit aborted \""+stop+"\"\n" {
		t.Fatalf("got\n%s", got)
	}
	poll.Within(5*time.Second, func() bool { return len(e.disp.Kills()) > 0 })
	if kills := e.disp.Kills(); len(kills) != 1 || kills[0] != id {
		t.Fatalf("kills %v", kills)
	}
	e.chunk(id, 22, "8\n")
	e.exit(id, proto.ReasonKilled, 143, 24)
	if got := summary(e.notes("default", 2)); got != "3 monitor success \"4\\n5\"\n4 limit aborted \""+stop+"\"\n" {
		t.Fatalf("after the monitor's end, want no more notifications, got\n%s", got)
	}
	j, _ := e.svc.Job(t.Context(), id)
	if j.Limits.TimeoutMS != (30*time.Minute).Milliseconds() || j.Status != coordinator.StatusAborted {
		t.Fatalf("monitor: timeout %d, status %s", j.Limits.TimeoutMS, j.Status)
	}
	res, err := e.svc.Start(t.Context(), coordinator.StartRequest{Command: "tail -f x", Cwd: "/", Monitor: true, Persistent: true})
	if err != nil || res.Job.Limits.TimeoutMS != 0 {
		t.Fatalf("persistent monitor: %+v, %v", res, err)
	}
}

// TestMonitorStdoutOnly: a monitor's work asks for stderr apart, and its events are stdout lines only
// (each stream's partial line held apart), while notify_on_output matches both; a job that is no
// monitor reads both as one.
func TestMonitorStdoutOnly(t *testing.T) {
	e := newEnv(t)
	id := e.start(coordinator.StartRequest{
		Monitor: true, Title: "deploy", NotifyOnOutput: &coordinator.OutputNotify{Pattern: "FATAL", DebounceMS: 1},
	})
	works := e.disp.Works()
	w := works[len(works)-1]
	if !w.SeparateStderr {
		t.Fatal("a monitor's work does not read stderr apart")
	}
	stderr := func(off int64, data string) {
		t.Helper()
		if err := e.svc.HandleChunk(t.Context(), coordinatortest.ClaimedChunk(e.svc, &coordinator.Chunk{JobID: id, Offset: off, Data: []byte(data), Stderr: true})); err != nil {
			t.Fatal(err)
		}
	}
	e.chunk(id, 0, "rea")              // stdout "rea…"
	stderr(3, "warn: slow\nFATAL x\n") // 19 bytes of stderr between stdout's halves
	e.chunk(id, 22, "dy\n")            // stdout's line ends: "ready"
	e.exit(id, proto.ReasonExit, 0, 25)
	var monitor, matched []string
	for _, n := range e.notes("default", 0) {
		switch n.Kind {
		case coordinator.KindMonitor:
			monitor = append(monitor, n.Detail)
		case coordinator.KindOutput:
			matched = append(matched, n.Detail)
		}
	}
	if strings.Join(monitor, "|") != "ready" {
		t.Errorf("monitor events %q, want only the stdout line", monitor)
	}
	if len(matched) != 1 || !strings.Contains(matched[0], "FATAL") {
		t.Errorf("matches %q, want the stderr line's", matched)
	}

	plain := e.start(coordinator.StartRequest{})
	works = e.disp.Works()
	w = works[len(works)-1]
	if w.JobID != plain || w.SeparateStderr {
		t.Fatalf("a plain job's work %+v", w)
	}
}

// TestSessionEnd: ending a session stops its jobs, queued or running, as session_ended, with no
// notification; other sessions are untouched.
func TestSessionEnd(t *testing.T) {
	e := newEnv(t)
	running := e.start(coordinator.StartRequest{Session: "s1", NotifyOnOutput: &coordinator.OutputNotify{Pattern: "x"}})
	e.event(&coordinator.Event{Kind: proto.EventAccepted, JobID: running, Runner: "r1", Time: e.clk.Now()})
	other := e.start(coordinator.StartRequest{Session: "s2"})
	e.disp.SetWithdraw(true)
	queued, err := e.svc.Start(t.Context(), coordinator.StartRequest{Command: "sleep 1", Cwd: "/", Session: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := e.svc.EndSession(t.Context(), "s1")
	if err != nil || len(ids) != 2 {
		t.Fatalf("end session: %v, %v", ids, err)
	}
	if kills := e.disp.Kills(); len(kills) != 1 || kills[0] != running {
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
	e.event(&coordinator.Event{Kind: proto.EventAccepted, JobID: id, Runner: "r1", Time: e.clk.Now()})
	for range 3 {
		e.clk.advance(600 * time.Millisecond)
		e.svc.TouchSession("agent")
		time.Sleep(20 * time.Millisecond) // the check loop's runs in which the renewed session may not end
	}
	if kills := e.disp.Kills(); len(kills) != 0 {
		t.Fatalf("a renewed session ended: %v", kills)
	}
	e.clk.advance(1100 * time.Millisecond)
	poll.Within(5*time.Second, func() bool { return len(e.disp.Kills()) > 0 })
	if kills := e.disp.Kills(); len(kills) != 1 || kills[0] != id {
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
	// Let the long-poll begin waiting: nothing shows that it does, and one that began late would
	// find the notification stored and pass without waiting.
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
		{"negative debounce", second(e.svc.Start(ctx, coordinator.StartRequest{Command: "x", Cwd: "/", NotifyOnOutput: &coordinator.OutputNotify{Pattern: "a", DebounceMS: -1}})), coordinator.EINVALID, "notify_on_output.debounce_ms"},
		{"persistent alone", second(e.svc.Start(ctx, coordinator.StartRequest{Command: "x", Cwd: "/", Persistent: true})), coordinator.EINVALID, "persistent"},
		{"short lease", second(e.svc.OpenSession(ctx, "s", time.Millisecond)), coordinator.EINVALID, "lease_ms"},
		{"long tool call", second(e.svc.Start(ctx, coordinator.StartRequest{Command: "x", Cwd: "/", ToolCallID: strings.Repeat("a", 257)})), coordinator.EINVALID, "tool_call_id"},
		{"tool call with a newline", second(e.svc.Start(ctx, coordinator.StartRequest{Command: "x", Cwd: "/", ToolCallID: "toolu\n01"})), coordinator.EINVALID, "tool_call_id"},
		// Not through HTTP, which refuses such bytes in any field: the domain checks its own.
		{"tool call not UTF-8", second(e.svc.Start(ctx, coordinator.StartRequest{Command: "x", Cwd: "/", ToolCallID: "toolu\xff01"})), coordinator.EINVALID, "tool_call_id"},
	}
	for _, b := range bad {
		if coordinator.ErrorCode(b.err) != b.code || !strings.Contains(coordinator.ErrorMessage(b.err), b.want) {
			t.Errorf("%s: %v, want %s naming %s", b.name, b.err, b.code, b.want)
		}
	}
}

func second[T any](_ T, err error) error { return err }

func third[T, U any](_ T, _ U, err error) error { return err }
