package coordinator_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/proto"
)

// activity is an activity event of a job: waiting for input since since (zero: not), listening on ports.
func activity(id string, seq int64, at, since time.Time, ports ...coordinator.Port) *coordinator.Event {
	ev := &coordinator.Event{Kind: proto.EventActivity, JobID: id, Runner: "r1", Time: at, Seq: seq, Ports: ports}
	if !since.IsZero() {
		ev.InputSince = &since
	}
	return ev
}

// TestInputStall: a job whose processes the runner saw waiting for input for InputStallAfter gets
// one stall notification, whatever its last line, with the tail and the ways to answer; once per
// job, and never for a monitor.
func TestInputStall(t *testing.T) {
	e := newEnv(t, func(c *coordinator.Config) { c.RunnerDeadline = 24 * time.Hour })
	id := e.start(coordinator.StartRequest{Title: "setup", Stdin: true})
	e.chunk(id, 0, "\x1b[1mname\x1b[0m\n")
	// The runner's clock is an hour off: only the wait's length counts.
	runnerNow := e.clk.Now().Add(time.Hour)
	e.event(activity(id, 1, runnerNow, runnerNow.Add(-4*time.Second)))
	e.clk.advance(5 * time.Second)
	e.event(activity(id, 1, runnerNow, runnerNow)) // delivered again: ignored
	e.clk.advance(2 * time.Second)
	notes := e.eventually("default", 1)
	if len(notes) != 1 {
		t.Fatalf("notes %s", summary(notes))
	}
	n := notes[0]
	if n.Kind != coordinator.KindStall || n.Status != coordinator.NoteError ||
		!strings.Contains(n.Detail, "The command is waiting for input: all its processes have been blocked reading its standard input for 11s. Last output:\n\x1b[1mname\x1b[0m\n\nAnswer it with `sbx send "+id+" TEXT`") ||
		n.Summary != `Async command "setup" is waiting for input` {
		t.Fatalf("stall: %+v", n)
	}
	task := coordinator.RenderTask(n)
	if !strings.Contains(task, "is waiting for input</summary>") || !strings.Contains(task, "POST /v1/jobs/"+id+"/stdin") || strings.Contains(task, "Kill this task and re-run with piped input") {
		t.Fatalf("task rendering:\n%s", task)
	}
	// Answered, then waiting again: the agent was told once.
	e.event(activity(id, 2, runnerNow, time.Time{}))
	e.event(activity(id, 3, runnerNow, runnerNow))
	e.clk.advance(time.Minute)

	// A monitor and another job wait together: the pass that notifies the other one looked at the
	// monitor too.
	mon := e.start(coordinator.StartRequest{Monitor: true, Stdin: true})
	other := e.start(coordinator.StartRequest{Title: "other", Stdin: true})
	e.event(activity(mon, 1, runnerNow, runnerNow))
	e.event(activity(other, 1, runnerNow, runnerNow))
	e.clk.advance(time.Minute)
	e.eventually("default", 2)
	e.exit(mon, proto.ReasonExit, 0, 0)
	e.exit(id, proto.ReasonExit, 0, int64(len("\x1b[1mname\x1b[0m\n")))
	notes = e.notes("default", 0)
	if got := summary(notes); got != fmt.Sprintf("1 stall error %q\n2 stall error %q\n3 finished success \"\"\n4 finished success \"\"\n", n.Detail, notes[1].Detail) || notes[1].JobID != other {
		t.Fatalf("notes:\n%s", got)
	}
}

// TestInputStallTTY: a tty job's stall quotes its screen without escape sequences.
func TestInputStallTTY(t *testing.T) {
	e := newEnv(t, func(c *coordinator.Config) { c.RunnerDeadline = 24 * time.Hour })
	id := e.start(coordinator.StartRequest{Title: "npm init", TTY: true})
	e.chunk(id, 0, "\x1b[?25lpackage name: \x1b[2m(app)\x1b[22m ")
	now := e.clk.Now()
	e.event(activity(id, 1, now, now))
	e.clk.advance(10 * time.Second)
	notes := e.eventually("default", 1)
	if len(notes) != 1 || notes[0].Event != "package name: (app)" || !strings.Contains(notes[0].Detail, "reading its terminal for 10s") {
		t.Fatalf("notes %+v", notes)
	}
}

// TestPorts: a port the job listens on is listed and notified once; a wait for it returns; the
// job's end clears the list.
func TestPorts(t *testing.T) {
	e := newEnv(t, func(c *coordinator.Config) { c.RunnerDeadline = 24 * time.Hour })
	id := e.start(coordinator.StartRequest{Title: "vite"})
	now := e.clk.Now()

	waited := make(chan *coordinator.WaitResult, 1)
	go func() {
		res, err := e.svc.WaitFor(context.Background(), id, time.Minute, coordinator.WaitCond{Port: 5173})
		if err != nil {
			t.Error(err)
		}
		waited <- res
	}()
	e.event(activity(id, 1, now, time.Time{}, coordinator.Port{Address: "::1", Port: 24678}))
	if res, err := e.svc.WaitFor(t.Context(), id, time.Minute, coordinator.WaitCond{AnyPort: true}); err != nil || res.Port == nil || res.Port.Port != 24678 || res.Done {
		t.Fatalf("wait for any port = %+v, %v", res, err)
	}
	e.event(activity(id, 2, now, time.Time{}, coordinator.Port{Address: "::1", Port: 24678}, coordinator.Port{Address: "127.0.0.1", Port: 5173}))
	res := <-waited
	if res == nil || res.Port == nil || *res.Port != (coordinator.Port{Address: "127.0.0.1", Port: 5173}) {
		t.Fatalf("wait for 5173 = %+v", res)
	}
	j, err := e.svc.Job(t.Context(), id)
	if err != nil || len(j.Ports) != 2 {
		t.Fatalf("job ports %+v, %v", j, err)
	}
	// Gone and back: not notified again.
	e.event(activity(id, 3, now, time.Time{}))
	e.event(activity(id, 4, now, time.Time{}, coordinator.Port{Address: "127.0.0.1", Port: 5173}))
	notes := e.wantNotes("1 port success \"listening on [::1]:24678\"\n2 port success \"listening on 127.0.0.1:5173\"\n")
	if notes[1].Summary != `Async command "vite" is listening on 127.0.0.1:5173` || !strings.Contains(notes[1].Text, "detail: listening on 127.0.0.1:5173") {
		t.Fatalf("port notification %+v", notes[1])
	}
	e.exit(id, proto.ReasonKilled, 143, 0)
	if j, _ := e.svc.Job(t.Context(), id); len(j.Ports) != 0 {
		t.Fatalf("an ended job listens on %v", j.Ports)
	}
	if res, err := e.svc.WaitFor(t.Context(), id, time.Minute, coordinator.WaitCond{Port: 5173}); err != nil || !res.Done || res.Port != nil {
		t.Fatalf("wait for a port of an ended job = %+v, %v", res, err)
	}
	if _, err := e.svc.WaitFor(t.Context(), id, time.Minute, coordinator.WaitCond{Port: 70000}); coordinator.ErrorCode(err) != coordinator.EINVALID {
		t.Fatalf("port 70000: %v", err)
	}
}

// TestTTYMatching: notify_on_output and pattern waits see a tty job's text without escape
// sequences, and "$" matches at its CRLF line ends; the offset is the raw output's.
func TestTTYMatching(t *testing.T) {
	e := newEnv(t)
	id := e.start(coordinator.StartRequest{TTY: true, NotifyOnOutput: &coordinator.OutputNotify{Pattern: `^ready on \S+$`}})
	out := "\x1b[32mbuilding\x1b[0m\r\n\x1b[1mready\x1b[0m on \x1b]8;;http://x\x1b\\http://localhost:5173\x1b]8;;\x1b\\\r\n"
	e.chunk(id, 0, out)
	notes := e.eventually("default", 1)
	if len(notes) != 1 || !strings.Contains(notes[0].Detail, "Matched text: ready on http://localhost:5173.") {
		t.Fatalf("notes %s", summary(notes))
	}
	res, err := e.svc.Wait(t.Context(), id, time.Minute, regexp.MustCompile(`(?m)ready on (\S+)$`))
	if err != nil || !res.PatternMatched || res.Matched != "ready on http://localhost:5173" || out[res.MatchedOffset:res.MatchedOffset+5] != "ready" {
		t.Fatalf("wait = %+v, %v", res, err)
	}
}

// TestTTYRequest: tty_size needs tty and a size in range, named in the error; a resize asks the
// runner, shows in the job, and is refused for a job without a terminal or one that ended.
func TestTTYRequest(t *testing.T) {
	e := newEnv(t)
	for _, tt := range []struct {
		req   coordinator.StartRequest
		field string
	}{
		{coordinator.StartRequest{TTYSize: &coordinator.TTYSize{Rows: 24, Cols: 80}}, "tty_size applies only"},
		{coordinator.StartRequest{TTY: true, TTYSize: &coordinator.TTYSize{Rows: 0, Cols: 80}}, "tty_size.rows"},
		{coordinator.StartRequest{TTY: true, TTYSize: &coordinator.TTYSize{Rows: 24, Cols: 100000}}, "tty_size.cols"},
	} {
		tt.req.Command, tt.req.Cwd = "true", "/"
		if _, err := e.svc.Start(t.Context(), tt.req); coordinator.ErrorCode(err) != coordinator.EINVALID || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%+v: %v, want EINVALID naming %s", tt.req, err, tt.field)
		}
	}
	id := e.start(coordinator.StartRequest{TTY: true})
	if err := e.svc.Resize(t.Context(), id, coordinator.TTYSize{Rows: 0, Cols: 80}); coordinator.ErrorCode(err) != coordinator.EINVALID || !strings.Contains(err.Error(), "rows") {
		t.Fatalf("resize to 0 rows: %v", err)
	}
	if err := e.svc.Resize(t.Context(), id, coordinator.TTYSize{Rows: 50, Cols: 132}); err != nil {
		t.Fatal(err)
	}
	if j, _ := e.svc.Job(t.Context(), id); j.TTYSize == nil || *j.TTYSize != (coordinator.TTYSize{Rows: 50, Cols: 132}) {
		t.Fatalf("job after resize: %+v", j)
	}
	var sent *coordinator.Control
	for _, c := range e.disp.Controls() {
		if c.Op == proto.OpResize {
			sent = c
		}
	}
	if sent == nil || sent.JobID != id || *sent.Size != (coordinator.TTYSize{Rows: 50, Cols: 132}) {
		t.Fatalf("control sent: %+v", sent)
	}
	plain := e.start(coordinator.StartRequest{})
	if err := e.svc.Resize(t.Context(), plain, coordinator.TTYSize{Rows: 50, Cols: 132}); coordinator.ErrorCode(err) != coordinator.ECONFLICT {
		t.Fatalf("resize of a job without a terminal: %v", err)
	}
	e.exit(id, proto.ReasonExit, 0, 0)
	if err := e.svc.Resize(t.Context(), id, coordinator.TTYSize{Rows: 50, Cols: 132}); coordinator.ErrorCode(err) != coordinator.ECONFLICT {
		t.Fatalf("resize of an ended job: %v", err)
	}
	// A tty job's input goes to its terminal: it needs no stdin: true.
	tty := e.start(coordinator.StartRequest{TTY: true})
	if err := e.svc.Input(t.Context(), tty, []byte("y\n"), false); err != nil {
		t.Fatal(err)
	}
	if err := e.svc.Input(t.Context(), plain, []byte("y\n"), false); coordinator.ErrorCode(err) != coordinator.ECONFLICT {
		t.Fatalf("input of a job without stdin: %v", err)
	}
}

// TestPortNotesBounded: a job that opens port after port is told about MaxPortNotes of them; its
// object still lists the ports it has.
func TestPortNotesBounded(t *testing.T) {
	e := newEnv(t, func(c *coordinator.Config) { c.RunnerDeadline = 24 * time.Hour })
	id := e.start(coordinator.StartRequest{})
	for i := range coordinator.MaxPortNotes + 5 {
		e.event(activity(id, int64(i+1), e.clk.Now(), time.Time{}, coordinator.Port{Address: "127.0.0.1", Port: 10000 + i}))
	}
	if n := len(e.notes("default", 0)); n != coordinator.MaxPortNotes {
		t.Fatalf("%d port notifications, want %d", n, coordinator.MaxPortNotes)
	}
	if j, _ := e.svc.Job(t.Context(), id); len(j.Ports) != 1 || j.Ports[0].Port != 10000+coordinator.MaxPortNotes+4 {
		t.Fatalf("ports %+v", j.Ports)
	}
}
