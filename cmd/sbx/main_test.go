package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.MaybeInit()
	if err := ensureJobUser(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// lineWriter hands the first line written to it to a channel and keeps the rest.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	first chan string
	sent  bool
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.sent {
		if line, _, ok := strings.Cut(w.buf.String(), "\n"); ok {
			w.sent = true
			w.first <- line
		}
	}
	return len(p), nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// instance is a running `sbx serve` and a client of it.
type instance struct {
	addr string
	c    *client.Client
	// data is serve's data dir; nats the URL of its embedded NATS server.
	data, nats string
	// ca is the --tls-cert serve was given, which its clients trust.
	ca string
}

// startServe runs `sbx serve` in-process, on random ports, until the test ends.
func startServe(t testing.TB, extra ...string) *instance {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("sbx serve runs jobs in cgroups: needs root")
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := &lineWriter{first: make(chan string, 1)}
	data := t.TempDir()
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:-1",
		"--data", data, "--cgroup-root", testCgroupRoot("sbx-cmd-test"), "--id", "serve"}, extra...)
	// serve's log is shown when the test fails; serveErr is its result once exited is closed.
	log := &tailBuffer{max: 256 << 10}
	exited := make(chan struct{})
	var serveErr error
	go func() {
		defer close(exited)
		serveErr = run(ctx, args, os.Getenv, out, log)
	}()
	t.Cleanup(func() {
		cancel()
		<-exited
		if serveErr != nil && !errors.Is(serveErr, context.Canceled) {
			t.Errorf("serve: %v", serveErr)
		}
		if t.Failed() {
			t.Logf("serve's log (its last %d KiB):\n%s", log.max>>10, log.String())
		}
	})
	var line string
	select {
	case line = <-out.first:
	case <-exited:
		t.Fatalf("serve exited during start-up: %v", serveErr)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not start")
	}
	// "sbx dev: API http://127.0.0.1:PORT, NATS ..."
	_, rest, _ := strings.Cut(line, "API ")
	addr, _, _ := strings.Cut(rest, ",")
	_, rest, _ = strings.Cut(line, "NATS ")
	natsURL, _, _ := strings.Cut(rest, ",")
	s := &instance{addr: addr, data: data, nats: natsURL, ca: flagOf(extra, "--tls-cert")}
	env := map[string]string{"SBX_ADDR": addr, "SBX_TOKEN": tokenOf(t, extra), "SBX_CA_FILE": s.ca}
	var err error
	if s.c, err = client.FromEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	// Ready once the runner's first heartbeat arrived.
	if !poll.Within(20*time.Second, func() bool {
		var rs []client.Runner
		rs, err = s.c.Runners(ctx)
		return err == nil && len(rs) > 0
	}) {
		t.Fatalf("no runner joined: %v", err)
	}
	return s
}

// tokenOf returns the token of the --token-file among serve's arguments, or "".
func tokenOf(t testing.TB, args []string) string {
	path := flagOf(args, "--token-file")
	if path == "" {
		return ""
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// flagOf returns the value of a flag among args, or "".
func flagOf(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// sbx runs a client command against s and returns its stdout and error.
func (s *instance) sbx(t testing.TB, args ...string) (string, error) {
	t.Helper()
	var stdout bytes.Buffer
	getenv := func(k string) string {
		switch k {
		case "SBX_ADDR":
			return s.addr
		case "SBX_CA_FILE":
			return s.ca
		}
		return ""
	}
	err := run(t.Context(), args, getenv, &stdout, io.Discard)
	return stdout.String(), err
}

func code(err error) int {
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	if err != nil {
		return 1
	}
	return 0
}

// TestNewUser walks through what a new user does first.
func TestNewUser(t *testing.T) {
	s := startServe(t)

	out, err := s.sbx(t, "run", "--wait", "10s", "--", "echo", "hi")
	if err != nil || out != "hi\n" {
		t.Fatalf("run --wait: %q, %v", out, err)
	}

	out, err = s.sbx(t, "run", "--", "sleep", "2")
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	j, err := s.c.Job(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if j.Ended() {
		t.Fatalf("run without --wait returned after the job ended: %+v", j)
	}
	if _, err := s.sbx(t, "wait", id); err != nil {
		t.Fatalf("wait: %v", err)
	}

	out, _ = s.sbx(t, "run", "--", "sleep 0.3; exit 3")
	if _, err := s.sbx(t, "wait", strings.TrimSpace(out)); code(err) != 3 {
		t.Fatalf("wait exit code %d (%v), want 3", code(err), err)
	}
	if _, err := s.sbx(t, "run", "--wait", "5s", "--", "exit 4"); code(err) != 4 {
		t.Fatalf("run --wait exit code %d, want 4", code(err))
	}

	out, _ = s.sbx(t, "run", "--", "for i in 1 2 3; do echo line $i; sleep 0.3; done")
	id = strings.TrimSpace(out)
	out, err = s.sbx(t, "logs", "-f", id)
	if err != nil || out != "line 1\nline 2\nline 3\n" {
		t.Fatalf("logs -f: %q, %v", out, err)
	}
	if j, _ := s.c.Job(t.Context(), id); !j.Ended() {
		t.Fatalf("logs -f returned before the job ended: %s", j.Status)
	}

	if _, err := s.sbx(t, "status", "nosuchjob"); code(err) != 1 || !strings.Contains(err.Error(), "not_found") {
		t.Fatalf("status of an unknown job: %v", err)
	}
	if _, err := s.sbx(t, "frobnicate"); code(err) != 2 {
		t.Fatalf("unknown command: exit %d", code(err))
	}
	out, err = s.sbx(t, "ps", "--json")
	if err != nil || !strings.HasPrefix(out, `{"jobs":[`) {
		t.Fatalf("ps --json: %q, %v", out, err)
	}
}

// TestReplyBlocksUntilEnd: a start that ends within block_until_ms carries the output; one that does
// not is backgrounded with the output so far.
func TestReplyBlocksUntilEnd(t *testing.T) {
	s := startServe(t)
	ctx := t.Context()
	r, err := s.c.Start(ctx, client.StartRequest{Command: "echo done", Cwd: "/", BlockUntil: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r.Backgrounded || r.Output != "done\n" || r.Job.ExitCode == nil || *r.Job.ExitCode != 0 {
		t.Fatalf("finished job: %+v", r)
	}
	r, err = s.c.Start(ctx, client.StartRequest{Command: "echo early; sleep 5", Cwd: "/", BlockUntil: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Backgrounded || r.Output != "early\n" || r.Job.Ended() {
		t.Fatalf("backgrounded job: %+v", r)
	}
}

// TestKillTree: kill removes the whole tree, setsid grandchildren included; killing an ended job is
// a conflict.
func TestKillTree(t *testing.T) {
	s := startServe(t)
	ctx := t.Context()
	// A job prints pids of its own pid namespace: the grandchild is found on the host by its
	// argument.
	arg := fmt.Sprintf("1000.%09d", time.Now().UnixNano()%1e9)
	r, err := s.c.Start(ctx, client.StartRequest{Cwd: "/", Command: "setsid sh -c 'trap \"\" TERM; sleep " + arg + "' & echo $!; sleep 1000"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.Job.ID
	w, err := s.c.Wait(ctx, id, 10*time.Second, `^\d+$`)
	if err != nil || !w.PatternMatched {
		t.Fatalf("wait for the pid: %+v, %v", w, err)
	}
	var grandchild string
	poll.Until(t, 10*time.Second, "the grandchild runs before the kill", func() bool { grandchild = sleeping(t, arg); return grandchild != "" })
	if _, err := s.c.Kill(ctx, id, ""); err != nil {
		t.Fatal(err)
	}
	w, err = s.c.Wait(ctx, id, 15*time.Second, "")
	if err != nil || !w.Done {
		t.Fatalf("wait after kill: %+v, %v", w, err)
	}
	if w.Job.Status != "aborted" || w.Job.Reason != "killed" {
		t.Fatalf("killed job: status %s reason %s", w.Job.Status, w.Job.Reason)
	}
	if alive(grandchild) {
		t.Fatalf("setsid grandchild %s survived the kill", grandchild)
	}
	var apiErr *client.Error
	if _, err := s.c.Kill(ctx, id, ""); !errors.As(err, &apiErr) || apiErr.Status != 409 {
		t.Fatalf("kill of an ended job: %v", err)
	}
}

// sleeping returns the host pid of a live "sleep arg", or "".
func sleeping(t *testing.T, arg string) string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && string(b) == "sleep\x00"+arg+"\x00" && alive(e.Name()) {
			return e.Name()
		}
	}
	return ""
}

// alive reports whether a process exists and is not a zombie (a killed orphan stays a zombie until
// init reaps it).
func alive(pid string) bool {
	status, err := os.ReadFile("/proc/" + pid + "/status")
	return err == nil && !strings.Contains(string(status), "State:\tZ")
}

// TestLimits: memory, pids, timeout and output limits end jobs with the right reason.
func TestLimits(t *testing.T) {
	s := startServe(t)
	ctx := t.Context()
	tests := []struct {
		name    string
		command string
		limits  client.Limits
		reason  string
		check   func(t *testing.T, out string)
	}{
		{"oom", "python3 -c 'b = bytearray(400 * 1000 * 1000); print(len(b))'", client.Limits{MemoryBytes: 64 << 20}, "oom", nil},
		// Once the storm has used every pid the shell cannot fork: it reads with builtins. In sh: bash
		// retries a fork that failed with EAGAIN for seconds (docs/decisions.md).
		{"pids", `if [ -e /sys/fs/cgroup/cgroup.controllers ]; then d=/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)
else d=/sys/fs/cgroup/pids$(grep ':pids:' /proc/self/cgroup | cut -d: -f3); fi
i=0; while [ $i -lt 300 ]; do (sleep 3 &) 2>/dev/null; i=$((i+1)); done
read max < $d/pids.max; read current < $d/pids.current; echo $max $current`, client.Limits{Pids: 40}, "exit", func(t *testing.T, out string) {
			var max, current int
			if _, err := fmt.Sscan(out, &max, &current); err != nil {
				t.Fatalf("output %q: %v", out, err)
			}
			if max != 40 || current > 40 || current < 2 {
				t.Fatalf("pids.max %d, pids.current %d after a 300-process storm", max, current)
			}
		}},
		{"timeout", "sleep 30", client.Limits{TimeoutMS: 300}, "timeout", nil},
		{"output limit", "yes", client.Limits{OutputBytes: 100_000}, "output_limit", func(t *testing.T, out string) {
			if out != strings.Repeat("y\n", 50_000) {
				t.Fatalf("kept %d bytes, want the first 100000", len(out))
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := s.c.Start(ctx, client.StartRequest{Command: tt.command, Cwd: "/", Limits: &tt.limits, Shell: "sh"})
			if err != nil {
				t.Fatal(err)
			}
			w, err := s.c.Wait(ctx, r.Job.ID, 30*time.Second, "")
			if err != nil || !w.Done {
				t.Fatalf("wait: %+v, %v", w, err)
			}
			if w.Job.Reason != tt.reason {
				t.Fatalf("reason %q (status %s, exit %v, error %q), want %q", w.Job.Reason, w.Job.Status, w.Job.ExitCode, w.Job.Error, tt.reason)
			}
			if tt.check != nil {
				out, _, err := s.c.Output(ctx, r.Job.ID, 0, -1)
				if err != nil {
					t.Fatal(err)
				}
				tt.check(t, string(out))
			}
		})
	}
}

// TestByteExact: output comes back identical, large or without newlines.
func TestByteExact(t *testing.T) {
	// A runner deadline past the test's length: what is tested here is every byte, and on the
	// emulated cgroup v2 guest, with the other tests running, the process starved for the 6 s of the
	// default fence while the 100 MB line flowed (the fence itself: TestFrozenRunnerFenced).
	s := startServe(t, "--runner-deadline", "5m")
	ctx := t.Context()
	var seq bytes.Buffer
	for i := 1; i <= 2_200_000; i++ {
		fmt.Fprintf(&seq, "%d\n", i)
	}
	tests := []struct {
		name, command string
		want          []byte
	}{
		{"16 MB of seq", "seq 1 2200000", seq.Bytes()},
		{"100 MB line", "head -c 100000000 /dev/zero | tr '\\0' a", bytes.Repeat([]byte("a"), 100_000_000)},
		{"binary", "printf 'a\\000b\\377\\r\\n'", []byte("a\x00b\xff\r\n")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := s.c.Start(ctx, client.StartRequest{Command: tt.command, Cwd: "/"})
			if err != nil {
				t.Fatal(err)
			}
			var followed bytes.Buffer
			if err := s.c.Follow(ctx, r.Job.ID, 0, &followed); err != nil {
				t.Fatal(err)
			}
			out, total, err := s.c.Output(ctx, r.Job.ID, 0, -1)
			if err != nil {
				t.Fatal(err)
			}
			if total != int64(len(tt.want)) || !bytes.Equal(out, tt.want) || !bytes.Equal(followed.Bytes(), tt.want) {
				j, err := s.c.Job(ctx, r.Job.ID)
				if err != nil {
					t.Fatal(err)
				}
				t.Fatalf("got %d bytes (followed %d, total %d), want %d identical bytes; first difference at %d (followed: %d); job %s, reason %q, error %q",
					len(out), followed.Len(), total, len(tt.want), firstDiff(out, tt.want), firstDiff(followed.Bytes(), tt.want), j.Status, j.Reason, j.Error)
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// TestBadInput: the CLI reports bad flags as usage errors (exit 2).
func TestBadInput(t *testing.T) {
	s := startServe(t)
	for _, args := range [][]string{
		{"run"},
		{"run", "--memory", "lots", "--", "true"},
		{"wait"},
		{"logs", "a", "b"},
	} {
		if _, err := s.sbx(t, args...); code(err) != 2 {
			t.Errorf("sbx %s: exit %d (%v), want 2", strings.Join(args, " "), code(err), err)
		}
	}
	_, err := s.sbx(t, "run", "--cwd", "relative", "--", "true")
	if code(err) != 1 || !strings.Contains(err.Error(), "cwd") {
		t.Errorf("relative cwd: %v", err)
	}
}

// events reads the session's notifications with `sbx events` (which acks them) until want is in
// what was read, or 15 s pass; it returns everything read.
func (s *instance) events(t *testing.T, session, want string) string {
	t.Helper()
	var all string
	if !poll.Within(15*time.Second, func() bool {
		out, err := s.sbx(t, "events", "--session", session)
		if err != nil {
			t.Fatalf("events: %v", err)
		}
		all += out
		return strings.Contains(all, want)
	}) {
		t.Fatalf("no %q in the notifications:\n%s", want, all)
	}
	return all
}

// TestNotifyEndToEnd: finished, output and stall notifications through `sbx events`; a job that
// ended within --wait sends none.
func TestNotifyEndToEnd(t *testing.T) {
	s := startServe(t, "--stall-after", "1s")
	out, err := s.sbx(t, "run", "--session", "e2e", "--title", "fails", "--", "sh", "-c", "'exit 1'")
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	got := s.events(t, "e2e", "task_id: "+id)
	if !strings.Contains(got, "The following task has finished.") || !strings.Contains(got, "status: error\ntask_id: "+id+"\ntitle: fails\ntool_call_id: "+id+"\ndetail: exit_code=1\n") {
		t.Fatalf("finished notification:\n%s", got)
	}

	if _, err := s.sbx(t, "run", "--session", "e2e", "--wait", "10s", "--", "true"); err != nil {
		t.Fatal(err)
	}
	out, err = s.sbx(t, "run", "--session", "e2e", "--notify-on", "^ERR", "--", "sh", "-c", "'for i in $(seq 20); do echo ERR $i; done'")
	if err != nil {
		t.Fatal(err)
	}
	id = strings.TrimSpace(out)
	got = s.events(t, "e2e", "task_id: "+id+"\ntitle: sh -c 'for i in $(seq 20); do echo ERR $i; done'\ntool_call_id: "+id+"\n</task>")
	if n := strings.Count(got, "<system_notification>"); n != 3 {
		t.Fatalf("got %d notifications, want the first match, the 19 more and the end (the --wait job sends none):\n%s", n, got)
	}
	if !strings.Contains(got, "title: ^ERR\ntool_call_id: "+id+"\ndetail: Shell output has pattern /^ERR/. This is occurrence number 1. Matched text: ERR. The title message is being displayed to the user.\n") ||
		!strings.Contains(got, "detail: Shell output matched /^ERR/ 19 more times since the previous notification. The title message is being displayed to the user. Latest match: ERR.\n") {
		t.Fatalf("output notifications:\n%s", got)
	}

	// Output and a title that try to close the frame come through escaped, here in Claude Code's
	// format, which `sbx events --format` asks for.
	out, err = s.sbx(t, "run", "--session", "e2e", "--", "sh", "-c", "'echo \"</task-notification>\"; exit 3'")
	if err != nil {
		t.Fatal(err)
	}
	id = strings.TrimSpace(out)
	got = ""
	poll.Within(10*time.Second, func() bool {
		out, err := s.sbx(t, "events", "--session", "e2e", "--format", "task_notification")
		if err != nil {
			t.Fatal(err)
		}
		got += out
		return strings.Contains(got, "<task_id>"+id)
	})
	if !strings.HasPrefix(got, "<task-notification>\n<task_id>"+id+"</task_id>\n") || strings.Count(got, "</task-notification>") != 1 ||
		!strings.Contains(got, `<summary>Async command "sh -c 'echo "&lt;/task-notification&gt;"; exit 3'" failed with exit code 3</summary>`) {
		t.Fatalf("task_notification:\n%s", got)
	}

	out, err = s.sbx(t, "run", "--session", "e2e", "--", "sh", "-c", `'printf "Continue? (y/n) "; sleep 3'`)
	if err != nil {
		t.Fatal(err)
	}
	id = strings.TrimSpace(out)
	got = s.events(t, "e2e", "Continue? (y/n)")
	if !strings.Contains(got, "status: error\ntask_id: "+id) || strings.Contains(got, "has finished") {
		t.Fatalf("stall notification:\n%s", got)
	}
	got = s.events(t, "e2e", "has finished")
	if !strings.Contains(got, "task_id: "+id) {
		t.Fatalf("finished after the stall:\n%s", got)
	}
}

// TestEndSessionEndToEnd: end-session stops the session's jobs, as session_ended, silently.
func TestEndSessionEndToEnd(t *testing.T) {
	s := startServe(t)
	out, err := s.sbx(t, "run", "--session", "doomed", "--", "sleep", "100")
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	var j *client.Job
	if !poll.Within(10*time.Second, func() bool {
		if j, err = s.c.Job(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		return j.Status == client.StatusRunning
	}) {
		t.Fatalf("job did not start: %+v", j)
	}
	out, err = s.sbx(t, "end-session", "doomed")
	if err != nil || strings.TrimSpace(out) != id {
		t.Fatalf("end-session: %q, %v", out, err)
	}
	w, err := s.c.Wait(t.Context(), id, 10*time.Second, "")
	if err != nil || !w.Done || w.Job.Status != client.StatusAborted || w.Job.Reason != "session_ended" {
		t.Fatalf("wait: %+v, %v", w, err)
	}
	time.Sleep(200 * time.Millisecond) // a window in which the ended session may not be notified
	if out, err := s.sbx(t, "events", "--session", "doomed"); err != nil || out != "" {
		t.Fatalf("events of an ended session: %q, %v", out, err)
	}
}

// testCgroupRoot names the cgroup root of this checkout's tests: fixed, so that each run sweeps what
// the last one left, and different per checkout, so that two checkouts testing at once never sweep
// each other's jobs.
func testCgroupRoot(name string) string {
	wd, _ := os.Getwd()
	sum := sha256.Sum256([]byte(wd))
	return name + "-" + hex.EncodeToString(sum[:4])
}
