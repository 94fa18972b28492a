package sandbox

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-dev/sbx/internal/poll"
)

func TestRun(t *testing.T) {
	tests := []struct {
		name       string
		spec       Spec
		wantOut    string
		wantCode   int
		wantSignal int
	}{
		{"echo", sh("echo", "echo hi"), "hi\n", 0, 0},
		{"exit code", sh("exit", "exit 3"), "", 3, 0},
		{"signal", sh("signal", "kill -9 $$"), "", 137, 9},
		{"stderr interleaved", sh("stderr", "echo a; echo b >&2; echo c"), "a\nb\nc\n", 0, 0},
		{"exact env", Spec{ID: "env", Path: "/bin/sh", Args: []string{"sh", "-c", `tr '\0' '\n' </proc/$$/environ`},
			Env: []string{"A=1", "B=two words"}}, "A=1\nB=two words\n", 0, 0},
		{"dir", Spec{ID: "dir", Path: "/bin/pwd", Dir: "/tmp"}, "/tmp\n", 0, 0},
		{"stdin is /dev/null", sh("stdin", "readlink /proc/self/fd/0; cat"), "/dev/null\n", 0, 0},
		// fd 3 is ls's own handle on the directory it lists.
		{"only fds 0-2", Spec{ID: "fds", Path: "/bin/ls", Args: []string{"ls", "/proc/self/fd"}}, "0\n1\n2\n3\n", 0, 0},
		{"own process group", sh("pgrp", "ps -o pid=,pgid= -p $$ | awk '{print ($1 == $2)}'"), "1\n", 0, 0},
	}
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				res, out := run(t, m, tt.spec)
				if out != tt.wantOut {
					t.Errorf("output = %q, want %q", out, tt.wantOut)
				}
				if res.ExitCode != tt.wantCode || res.Signal != tt.wantSignal {
					t.Errorf("exit %d signal %d, want %d %d", res.ExitCode, res.Signal, tt.wantCode, tt.wantSignal)
				}
			})
		}
	})
}

func TestStartsInsideCgroup(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, cfg := newTestManager(t, cfg)
		_, out := run(t, m, sh("where", "cat /proc/self/cgroup"))
		path := "/" + cfg.Root + "/where"
		// Lines are "id:controllers:path"; v2's line has no controllers.
		controllers := []string{""}
		if h, ok := m.h.(*v1Hierarchy); ok {
			controllers = nil
			for c := range h.mounts {
				controllers = append(controllers, c)
			}
		}
		for _, c := range controllers {
			found := false
			for _, line := range strings.Split(out, "\n") {
				parts := strings.SplitN(line, ":", 3)
				if len(parts) != 3 || parts[2] != path {
					continue
				}
				if c == "" && parts[1] == "" || c != "" && strings.Contains(","+parts[1]+",", ","+c+",") {
					found = true
				}
			}
			if !found {
				t.Errorf("controller %q: /proc/self/cgroup does not show %s:\n%s", c, path, out)
			}
		}
	})
}

func TestKillTree(t *testing.T) {
	tests := []struct {
		name       string
		trap       string
		wantSignal int
	}{
		{"term honoured", "", 15},
		{"term ignored", "trap '' TERM", 9},
	}
	eachVersion(t, func(t *testing.T, cfg Config) {
		cfg.KillGrace = 300 * time.Millisecond
		m, _ := newTestManager(t, cfg)
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				script := tt.trap + `
setsid sh -c 'sleep 1000; :' &
sh -c "trap '' TERM; sleep 1000; :" &
echo ready
sleep 1000`
				p, err := m.Start(sh("tree", script))
				if err != nil {
					t.Fatal(err)
				}
				r := bufio.NewReader(p.Output())
				if line, err := r.ReadString('\n'); line != "ready\n" {
					t.Fatalf("first line %q, %v", line, err)
				}
				var pids []int
				if !poll.Within(5*time.Second, func() bool { pids = groupPids(t, p); return len(pids) >= 6 }) {
					t.Fatalf("tree did not grow: %v", pids)
				}
				rest := drain(t, r)
				begin := time.Now()
				for range 2 {
					if err := p.Kill(); err != nil {
						t.Fatalf("Kill: %v", err)
					}
				}
				res, err := p.Wait()
				if err != nil {
					t.Errorf("Wait: %v", err)
				}
				if elapsed := time.Since(begin); elapsed > cfg.KillGrace+5*time.Second {
					t.Errorf("Kill+Wait took %s", elapsed)
				}
				if err := p.Kill(); err != nil {
					t.Errorf("Kill after Wait: %v", err)
				}
				if res.Signal != tt.wantSignal {
					t.Errorf("signal %d, want %d", res.Signal, tt.wantSignal)
				}
				rest()
				for _, pid := range pids {
					if !gone(pid) {
						t.Errorf("pid %d survived", pid)
					}
				}
			})
		}
	})
}

func TestKillConcurrentWithWait(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		p, err := m.Start(sh("race", "sleep 1000"))
		if err != nil {
			t.Fatal(err)
		}
		out := drain(t, p.Output())
		done := make(chan Result, 1)
		go func() {
			res, err := p.Wait()
			if err != nil {
				t.Errorf("Wait: %v", err)
			}
			done <- res
		}()
		for range 3 {
			go p.Kill()
		}
		if res := <-done; res.Signal != 15 {
			t.Errorf("signal %d, want 15", res.Signal)
		}
		if err := p.Signal(15); !errors.Is(err, os.ErrProcessDone) {
			t.Errorf("Signal after exit = %v, want os.ErrProcessDone", err)
		}
		out()
	})
}

// TestJobDiesWithRunner: a job dies with its runner, also after the init step dropped to another
// user (a credential change clears the parent-death signal), from a cold or a warm start.
func TestJobDiesWithRunner(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		for _, tc := range []struct {
			name string
			warm int
			cred *Credential
		}{
			{"cold", -1, nil},
			{"cold-nobody", -1, nobody()},
			{"warm", 2, nil},
			{"warm-nobody", 2, nobody()},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if tc.warm > 0 && (!warmInit || cfg.Version != "v1") {
					t.Skip("warm init steps are for cgroup v1 in the cgo build")
				}
				jobDiesWithRunner(t, cfg, tc.warm, tc.cred)
			})
		}
	})
}

func jobDiesWithRunner(t *testing.T, cfg Config, warm int, cred *Credential) {
	cfg.Warm = -1
	m, cfg := newTestManager(t, cfg)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	runner := exec.Command(exe)
	runner.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %s %d %s", runnerEnv, cfg.Version, cfg.Mountpoint, cfg.Root, warm, cred))
	runner.Stderr = os.Stderr
	stdout, err := runner.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := runner.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		runner.Process.Kill()
		runner.Wait()
		t.Fatalf("runner: %q, %v", line, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		if uid := procUID(t, pid); uid != cred.UID {
			t.Errorf("job runs as uid %d, want %d", uid, cred.UID)
		}
	}
	runner.Process.Kill()
	runner.Wait()
	if !poll.Within(5*time.Second, func() bool { return gone(pid) }) {
		t.Fatalf("job %d outlived its runner", pid)
	}
	// What a restarted runner does: the dead runner's cgroups (the job's, and any warm steps') are
	// still there.
	if n, err := m.Sweep(); n < 1 || err != nil {
		t.Errorf("Sweep() = %d, %v; want at least 1", n, err)
	}
}

// TestJobOutlivesThreads: a job lives on when the runtime ends threads of the runner — the one of the
// goroutine that started it, and others that goroutines returning while locked to them end: the init
// step's parent-death signal is tied to the thread that forked it, which must be a spawner's (spawn),
// whose thread lives as long as the process.
func TestJobOutlivesThreads(t *testing.T) {
	// endThread runs f on a goroutine locked to its thread, which the runtime ends when it returns
	// (all but the main thread, which it keeps), and waits until the thread is gone.
	endThread := func(f func()) {
		tids := make(chan int, 1)
		go func() {
			runtime.LockOSThread() // never unlocked
			f()
			tids <- unix.Gettid()
		}()
		tid := <-tids
		if tid == os.Getpid() {
			return
		}
		task := fmt.Sprintf("/proc/self/task/%d", tid)
		poll.Until(t, 10*time.Second, "the end of a thread", func() bool {
			_, err := os.Stat(task)
			return errors.Is(err, fs.ErrNotExist)
		})
	}
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		var (
			p   *Process
			err error
		)
		endThread(func() {
			spec := sh("outlive", "read x; echo got=$x")
			spec.Stdin = true
			p, err = m.Start(spec)
		})
		if err != nil {
			t.Fatal(err)
		}
		out := drain(t, p.Output())
		for range 4 * runtime.GOMAXPROCS(0) {
			endThread(func() {})
		}
		if _, err := p.Input().Write([]byte("hi\n")); err != nil {
			t.Fatalf("write the job's input: %v", err)
		}
		res, err := p.Wait()
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		if got := out(); res.ExitCode != 0 || got != "got=hi\n" {
			t.Errorf("job = %+v, output %q; want exit 0 and got=hi", res, got)
		}
	})
}

func TestLeftoversKilledAtExit(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		arg := daemonArg()
		p, err := m.Start(sh("daemon", "setsid sleep "+arg+" & echo $!"))
		if err != nil {
			t.Fatal(err)
		}
		out := drain(t, p.Output())
		// Killed before the job's result is known: a result that comes early (the init said
		// nothing of the job was left) must not come while something is.
		res := p.Result()
		if pids := survivors(t, arg); len(pids) > 0 {
			t.Errorf("daemon %v outlived its job", pids)
		}
		if _, err := p.Wait(); err != nil || res.ExitCode != 0 {
			t.Fatalf("Wait = %+v, %v", res, err)
		}
		if _, err := strconv.Atoi(strings.TrimSpace(out())); err != nil {
			t.Fatal(err)
		}
	})
}

func TestOutputBackpressure(t *testing.T) {
	const n = 2000000
	var want bytes.Buffer
	for i := 1; i <= n; i++ {
		want.WriteString(strconv.Itoa(i))
		want.WriteByte('\n')
	}
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		p, err := m.Start(sh("seq", "seq 1 "+strconv.Itoa(n)))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // a window in which the job, were its output not held, would finish
		select {
		case <-p.done:
			t.Fatal("job finished although nobody read its output")
		default:
		}
		h := sha256.New()
		got, err := io.Copy(h, p.Output())
		if err != nil {
			t.Fatal(err)
		}
		if got != int64(want.Len()) || !bytes.Equal(h.Sum(nil), sha256Sum(want.Bytes())) {
			t.Errorf("read %d bytes, want %d identical", got, want.Len())
		}
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
			t.Errorf("Wait = %+v, %v", res, err)
		}
	})
}

func sha256Sum(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}

func TestStartErrors(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, cfg := newTestManager(t, cfg)
		_, err := m.Start(Spec{ID: "missing", Path: "/nonexistent/prog"})
		if err == nil || !strings.Contains(err.Error(), "/nonexistent/prog") {
			t.Errorf("Start(missing program) = %v", err)
		}
		if left, err := jobCgroups(m); err != nil || len(left) != 0 {
			t.Errorf("cgroups left after failed start: %v, %v", left, err)
		}
		if res, out := run(t, m, sh("missing", "echo again")); res.ExitCode != 0 || out != "again\n" {
			t.Errorf("id reuse after failed start: %+v %q", res, out)
		}

		p, err := m.Start(sh("dup", "sleep 1000"))
		if err != nil {
			t.Fatal(err)
		}
		out := drain(t, p.Output())
		if _, err := m.Start(sh("dup", "true")); !errors.Is(err, ErrJobExists) {
			t.Errorf("duplicate Start = %v, want ErrJobExists", err)
		}
		p.Kill()
		p.Wait()
		out()

		if _, err := m.Start(Spec{ID: "dir", Path: "/bin/true", Dir: "/nonexistent"}); err == nil {
			t.Error("Start with missing dir succeeded")
		}
		if _, err := os.Stat(filepath.Join(cfg.Mountpoint, cfg.Root, "dir")); m.Version() == "v2" && err == nil {
			t.Error("cgroup left after failed start")
		}
	})
}

func TestOutputReadDeadline(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		p, err := m.Start(sh("deadline", "echo hello"))
		if err != nil {
			t.Fatal(err)
		}
		out, ok := p.Output().(interface {
			io.Reader
			SetReadDeadline(time.Time) error
		})
		if !ok {
			t.Fatalf("Output() is a %T, without SetReadDeadline", p.Output())
		}
		// Once the main process has exited, its output is in the pipe, unread.
		if _, err := p.Wait(); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if err := out.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
			t.Fatalf("SetReadDeadline: %v", err)
		}
		buf := make([]byte, 64)
		if n, err := out.Read(buf); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read past deadline = %d, %v; want 0, os.ErrDeadlineExceeded", n, err)
		}
		if err := out.SetReadDeadline(time.Time{}); err != nil {
			t.Fatalf("clear deadline: %v", err)
		}
		if b, err := io.ReadAll(out); string(b) != "hello\n" || err != nil {
			t.Errorf("after the deadline: %q, %v; want %q", b, err, "hello\n")
		}

		// A deadline also ends a Read that is already waiting: the pipe is pollable.
		p, err = m.Start(sh("idle", "sleep 1000"))
		if err != nil {
			t.Fatal(err)
		}
		out = p.Output().(interface {
			io.Reader
			SetReadDeadline(time.Time) error
		})
		if err := out.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
			t.Fatalf("SetReadDeadline: %v", err)
		}
		if n, err := out.Read(buf); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("Read with nothing written = %d, %v; want 0, os.ErrDeadlineExceeded", n, err)
		}
		out.SetReadDeadline(time.Time{})
		rest := drain(t, out)
		p.Kill()
		p.Wait()
		rest()
	})
}

// TestStages: a job's stages are stamped in order, between the start and the end of the job as the
// caller sees them, on the cold path (a job with an input) and, on v1, from a warm init step.
func TestStages(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		if m.warm != nil {
			// The job without an input then takes a warm step, which joined its cgroup before Start.
			waitWarm(t, m)
		}
		for _, stdin := range []bool{false, true} {
			t.Run(fmt.Sprintf("stdin=%v", stdin), func(t *testing.T) {
				spec := sh(fmt.Sprintf("stages-%v", stdin), "true")
				spec.Stdin = stdin
				before := Monotonic()
				p, err := m.Start(spec)
				if err != nil {
					t.Fatalf("Start: %v", err)
				}
				started := p.Stages()
				out := drain(t, p.Output())
				if _, err := p.Wait(); err != nil {
					t.Errorf("Wait: %v", err)
				}
				out()
				after := Monotonic()
				st := p.Stages()
				if started.Exec == 0 || started.Cgroup == 0 {
					t.Errorf("stages when Start returned = %+v, want cgroup and exec", started)
				}
				if !(before <= st.Cgroup && st.Cgroup <= st.Exec && st.Exec <= st.Exit && st.Exit <= after) {
					t.Errorf("stages %+v not in order between %v and %v", st, before, after)
				}
			})
		}
	})
}
