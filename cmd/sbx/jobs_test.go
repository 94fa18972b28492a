package main

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/internal/poll"
)

// TestAgentShell: what an agent's background shell does, through the CLI: bash by default, a wait
// that prints what its pattern matched, a sleep without a job.
func TestAgentShell(t *testing.T) {
	s := startServe(t)
	if _, err := exec.LookPath("bash"); err == nil {
		out, err := s.sbx(t, "run", "--wait", "10s", "--", "[[ -n $BASH_VERSION ]] && echo bash")
		if err != nil || out != "bash\n" {
			t.Errorf("default shell: %q, %v; want bash", out, err)
		}
	}
	out, err := s.sbx(t, "run", "--shell", "sh", "--wait", "10s", "--", "echo ${BASH_VERSION:-sh}")
	if err != nil || out != "sh\n" {
		t.Errorf("--shell sh: %q, %v", out, err)
	}

	out, err = s.sbx(t, "run", "--", "echo booting; sleep 0.2; echo listening on :8080; sleep 30")
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	out, err = s.sbx(t, "wait", "--pattern", `listening on :\d+`, "--timeout", "20s", id)
	if err != nil || out != "listening on :8080\n" {
		t.Errorf("wait --pattern: %q, %v; want the matched text", out, err)
	}
	if _, err := s.sbx(t, "kill", id); err != nil {
		t.Error(err)
	}

	out, err = s.sbx(t, "run", "--linger", "--wait", "10s", "--", "(sleep 0.3; echo late) & echo early")
	if err != nil || out != "early\nlate\n" {
		t.Errorf("--linger: %q, %v; want the background child's line too", out, err)
	}

	// A daemon that redirected its output ends a --linger job at once (killed); with
	// --linger-cgroup it stays the job's, running until killed with it. The job's $! is a pid of its
	// own pid namespace: the daemon is found on the host by its argument.
	arg := fmt.Sprintf("1000.%09d", time.Now().UnixNano()%1e9)
	out, err = s.sbx(t, "run", "--linger-cgroup", "--", "nohup setsid sleep "+arg+" >/dev/null 2>&1 & echo $!")
	if err != nil {
		t.Fatal(err)
	}
	id = strings.TrimSpace(out)
	if out, err := s.sbx(t, "wait", "--pattern", `^\d+$`, "--timeout", "20s", id); err != nil {
		t.Fatalf("wait for the daemon's pid: %q, %v", out, err)
	}
	if j, err := s.c.Wait(t.Context(), id, 500*time.Millisecond, ""); err != nil || j.Done || !j.Job.LingerCgroup {
		t.Fatalf("--linger-cgroup job with a daemon: %+v, %v", j, err)
	}
	var daemon string
	poll.Until(t, 10*time.Second, "the --linger-cgroup job's daemon runs", func() bool { daemon = sleeping(t, arg); return daemon != "" })
	if _, err := s.sbx(t, "kill", id); err != nil {
		t.Fatal(err)
	}
	if j, err := s.c.Wait(t.Context(), id, 20*time.Second, ""); err != nil || !j.Done || alive(daemon) {
		t.Errorf("killed --linger-cgroup job: %+v, %v; daemon %s alive %v", j, err, daemon, alive(daemon))
	}

	// A kill gives the job's children their grace, after the shell died of its SIGTERM.
	out, err = s.sbx(t, "run", "--", "(trap 'sleep 0.3; echo cleaned up; exit 0' TERM; while :; do sleep 0.05; done) & echo ready; wait")
	if err != nil {
		t.Fatal(err)
	}
	id = strings.TrimSpace(out)
	if _, err := s.sbx(t, "wait", "--pattern", "ready", "--timeout", "20s", id); err != nil {
		t.Fatal(err)
	}
	// Let the child set its trap after "ready": the test does not look into the job's processes.
	time.Sleep(100 * time.Millisecond)
	if _, err := s.sbx(t, "kill", id); err != nil {
		t.Fatal(err)
	}
	s.sbx(t, "wait", id)
	if out, _ := s.sbx(t, "logs", id); !strings.Contains(out, "cleaned up") {
		t.Errorf("logs after kill: %q, want the child's cleanup", out)
	}

	t0 := time.Now()
	if _, err := s.sbx(t, "wait", "--timeout", "300ms"); err != nil || time.Since(t0) < 300*time.Millisecond {
		t.Errorf("sleep: %v after %s", err, time.Since(t0))
	}
	if _, err := s.sbx(t, "wait"); code(err) != 2 {
		t.Errorf("wait without id or timeout: %v, want a usage error", err)
	}
}

// TestStdin: a job started with --stdin waits at a prompt, and sbx send answers it; a job without
// stdin, an ended job and an oversized send are refused with the reason.
func TestStdin(t *testing.T) {
	s := startServe(t)
	out, err := s.sbx(t, "run", "--stdin", "--", `printf 'Overwrite? (y/n) '; read answer; echo "answer=$answer"; cat; echo eof`)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	if _, err := s.sbx(t, "send", id, "y"); err != nil {
		t.Fatalf("send: %v", err)
	}
	if _, err := s.sbx(t, "send", "--no-newline", id, "more"); err != nil {
		t.Fatalf("send --no-newline: %v", err)
	}
	if _, err := s.sbx(t, "send", "--close", id, "text"); err != nil {
		t.Fatalf("send --close: %v", err)
	}
	if _, err := s.sbx(t, "wait", "--timeout", "20s", id); err != nil {
		t.Fatalf("wait: %v", err)
	}
	if out, _ := s.sbx(t, "logs", id); out != "Overwrite? (y/n) answer=y\nmoretext\neof\n" {
		t.Errorf("logs %q", out)
	}
	if _, err := s.sbx(t, "send", id, "late"); err == nil || !strings.Contains(err.Error(), "ended") {
		t.Errorf("send to an ended job: %v", err)
	}

	out, _ = s.sbx(t, "run", "--", "sleep 30")
	id = strings.TrimSpace(out)
	if _, err := s.sbx(t, "send", id, "y"); err == nil || !strings.Contains(err.Error(), "stdin") {
		t.Errorf("send to a job without stdin: %v", err)
	}
	s.sbx(t, "kill", id)
	if err := s.c.Input(t.Context(), id, strings.Repeat("x", 64<<10+1), false); err == nil {
		t.Error("an oversized send was accepted")
	}
}
