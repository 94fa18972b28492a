package sandbox

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/internal/poll"
)

// screen collects a job's output in the background, for tests that answer what it shows.
type screen struct {
	mu   sync.Mutex
	text strings.Builder
	done chan struct{}
}

func watchScreen(r io.Reader) *screen {
	s := &screen{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		buf := make([]byte, 4096)
		for {
			n, err := r.Read(buf)
			s.mu.Lock()
			s.text.Write(buf[:n])
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return s
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.text.String()
}

// await polls until the output holds want, failing the test after a deadline.
func (s *screen) await(t *testing.T, want string) {
	t.Helper()
	if !poll.Within(10*time.Second, func() bool { return strings.Contains(s.String(), want) }) {
		t.Fatalf("output never showed %q; it is %q", want, s.String())
	}
}

// end waits for EOF and returns the whole output.
func (s *screen) end(t *testing.T) string {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("output did not reach EOF; it is %q", s.String())
	}
	return s.String()
}

func bashTTY(id, script string, readonly bool) Spec {
	return Spec{ID: id, Path: "/bin/bash", Args: []string{"bash", "-c", script}, Env: []string{"PATH=/usr/bin:/bin", "TERM=xterm"},
		TTY: true, TTYSize: TTYSize{Rows: 30, Cols: 100}, Readonly: readonly}
}

// eachTTYMode runs f for a plain and, where the sandbox is available, a readonly job.
func eachTTYMode(t *testing.T, f func(t *testing.T, m *Manager, readonly bool)) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		t.Run("plain", func(t *testing.T) { f(t, m, false) })
		t.Run("readonly", func(t *testing.T) {
			requireReadonly(t)
			f(t, m, true)
		})
	})
}

// TestTTYPrompt: bash prints read -p's prompt only on a terminal; the answer typed on it reaches
// the command, and the output is what the terminal shows (the echoed answer, CRLF line ends).
func TestTTYPrompt(t *testing.T) {
	eachTTYMode(t, func(t *testing.T, m *Manager, readonly bool) {
		p, err := m.Start(bashTTY(fmt.Sprintf("prompt-%t", readonly), `tty; stty size; read -p 'Continue? (y/n) ' x; echo got=$x`, readonly))
		if err != nil {
			t.Fatal(err)
		}
		s := watchScreen(p.Output())
		s.await(t, "Continue? (y/n) ")
		if _, err := p.Input().Write([]byte("y\n")); err != nil {
			t.Fatal(err)
		}
		res, err := p.Wait()
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("Wait = %+v, %v", res, err)
		}
		out := s.end(t)
		// tty names the terminal: /dev/pts/N, or /dev/console inside bwrap, which binds it there.
		if strings.Contains(out, "not a tty") {
			t.Errorf("the job's stdin is not a terminal: %q", out)
		}
		for _, want := range []string{"30 100\r\n", "Continue? (y/n) y\r\n", "got=y\r\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("output %q lacks %q", out, want)
			}
		}
	})
}

// TestTTYResize: a resize changes what stty reports and signals the job (SIGWINCH), in a readonly
// job too, whose command is not in the terminal's session.
func TestTTYResize(t *testing.T) {
	eachTTYMode(t, func(t *testing.T, m *Manager, readonly bool) {
		p, err := m.Start(bashTTY(fmt.Sprintf("resize-%t", readonly),
			`trap 'echo "winch $(stty size)"; exit 0' WINCH; echo "ready $(stty size)"; while :; do sleep 0.05; done`, readonly))
		if err != nil {
			t.Fatal(err)
		}
		s := watchScreen(p.Output())
		s.await(t, "ready 30 100")
		if err := p.Resize(TTYSize{Rows: 50, Cols: 132}); err != nil {
			t.Fatal(err)
		}
		s.await(t, "winch 50 132")
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
			t.Fatalf("Wait = %+v, %v", res, err)
		}
		s.end(t)
		if err := p.Resize(TTYSize{Rows: 10, Cols: 10}); err == nil {
			t.Error("a resize after the end succeeded")
		}
	})
}

// TestTTYNoInjection: TIOCSTI pushes bytes into a terminal's input as if typed; the kernel allows
// it only on the caller's controlling terminal. A plain job's terminal is its own (the control:
// the ioctl works there); a readonly job's command is in bwrap's new session, so it is refused.
func TestTTYNoInjection(t *testing.T) {
	requireReadonly(t)
	script := `python3 -c '
import fcntl, termios
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"x")
    print("sti=ok")
except OSError as e:
    print("sti=errno%d" % e.errno)
'`
	eachTTYMode(t, func(t *testing.T, m *Manager, readonly bool) {
		p, err := m.Start(bashTTY(fmt.Sprintf("sti-%t", readonly), script, readonly))
		if err != nil {
			t.Fatal(err)
		}
		s := watchScreen(p.Output())
		if _, err := p.Wait(); err != nil {
			t.Fatal(err)
		}
		out := s.end(t)
		want := "sti=ok"
		if readonly {
			want = "sti=errno1" // EPERM
		}
		if !strings.Contains(out, want) {
			t.Fatalf("output %q, want %q", out, want)
		}
	})
}

func TestTTYSpec(t *testing.T) {
	spec := bashTTY("both", "true", false)
	spec.SeparateStderr = true
	if _, err := spec.validate(); !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("validate = %v, want ErrInvalidSpec", err)
	}
}

// TestTTYAsUser: a job run as another user reads and writes its terminal, and its processes are
// still seen waiting on it.
func TestTTYAsUser(t *testing.T) {
	eachTTYMode(t, func(t *testing.T, m *Manager, readonly bool) {
		spec := bashTTY(fmt.Sprintf("user-%t", readonly), `id -u; stty size; exec 3</dev/tty && echo devtty=ok; read -p 'name? ' x; echo got=$x`, readonly)
		spec.Credential = &Credential{UID: 65534, GID: 65534}
		p, err := m.Start(spec)
		if err != nil {
			t.Fatal(err)
		}
		s := watchScreen(p.Output())
		s.await(t, "name? ")
		awaitActivity(t, p, "waiting for input", func(a Activity) bool { return a.WaitingForInput })
		if _, err := p.Input().Write([]byte("ann\n")); err != nil {
			t.Fatal(err)
		}
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
			t.Fatalf("Wait = %+v, %v", res, err)
		}
		out := s.end(t)
		want := []string{"65534\r\n", "30 100\r\n", "got=ann\r\n"}
		if !readonly {
			want = append(want, "devtty=ok") // inside bwrap's new session there is no controlling terminal
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("output %q lacks %q", out, w)
			}
		}
	})
}

// TestTTYSessionInInit: a tty job starts through the init step, pid 1 of its pid namespace. The
// job's program leads a session of its own whose controlling terminal is the job's, in the
// terminal's foreground group (what SIGWINCH and typed ^C reach); the init has no terminal.
func TestTTYSessionInInit(t *testing.T) {
	// /proc/PID/stat: pid (comm) state ppid pgrp session tty_nr tpgid; neither comm has a space.
	script := `echo "init $(cut -d' ' -f7 /proc/1/stat) end"; echo "job $$ $(cut -d' ' -f5-8 /proc/$$/stat) end"`
	re := regexp.MustCompile(`init (\d+) end\r\njob (\d+) (\d+) (\d+) (\d+) (\d+) end`)
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		p, err := m.Start(bashTTY("session", script, false))
		if err != nil {
			t.Fatal(err)
		}
		s := watchScreen(p.Output())
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
			t.Fatalf("Wait = %+v, %v", res, err)
		}
		out := s.end(t)
		f := re.FindStringSubmatch(out)
		if f == nil {
			t.Fatalf("output %q does not match %s", out, re)
		}
		initTTY, pid, pgrp, sid, tty, tpgid := f[1], f[2], f[3], f[4], f[5], f[6]
		if initTTY != "0" {
			t.Errorf("the init has controlling terminal %s, want none", initTTY)
		}
		if pid == "1" || pgrp != pid || sid != pid {
			t.Errorf("job pid %s, group %s, session %s: want the init's child leading both", pid, pgrp, sid)
		}
		if tty == "0" || tpgid != pgrp {
			t.Errorf("job's terminal %s, its foreground group %s: want the job's terminal, group %s", tty, tpgid, pgrp)
		}
	})
}
