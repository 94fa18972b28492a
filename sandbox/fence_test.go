package sandbox

import (
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// startSleeper starts a job that runs until killed and returns it with a channel that yields its
// result once it ended.
func startSleeper(t *testing.T, m *Manager, id string) (*Process, <-chan Result) {
	t.Helper()
	p, err := m.Start(sh(id, "sleep 1000"))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	out := drain(t, p.Output())
	done := make(chan Result, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		res, err := p.Wait()
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		out()
		done <- res
	}()
	t.Cleanup(func() {
		_ = p.Kill()
		<-exited
	})
	return p, done
}

// waitKilled fails the test unless the job's result, a SIGKILL, comes within limit.
func waitKilled(t *testing.T, done <-chan Result, limit time.Duration) {
	t.Helper()
	select {
	case res := <-done:
		if res.Signal != int(unix.SIGKILL) {
			t.Fatalf("job ended %+v, want killed by SIGKILL", res)
		}
	case <-time.After(limit):
		t.Fatalf("the job still runs %s later", limit)
	}
}

// TestFence: a fence stays quiet while it is renewed, kills every job of its Manager once it is not
// (and says so), and kills them at once when its pipe closes, as when its runner dies. It runs in a
// process group of its own, with an empty environment. One that does not read its renewals is
// killed by the renewal that finds its pipe full.
func TestFence(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		cfg.Warm = -1
		m, _ := newTestManager(t, cfg)
		const after = time.Second

		t.Run("silence", func(t *testing.T) {
			p, done := startSleeper(t, m, "fenced-silence")
			f, err := m.StartFence(after)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			pid := f.cmd.Process.Pid
			if env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ"); err != nil || len(env) != 0 {
				t.Errorf("the fence's environment: %q, %v; want none", env, err)
			}
			if pgid, err := unix.Getpgid(pid); err != nil || pgid != pid {
				t.Errorf("the fence's process group: %d, %v; want its own, %d", pgid, err, pid)
			}
			// Renewed well within its time, for several times its time.
			var renewed time.Time
			for end := time.Now().Add(3 * after); time.Now().Before(end); time.Sleep(after / 10) {
				if err := f.Renew(); err != nil {
					t.Fatalf("Renew: %v", err)
				}
				renewed = time.Now()
			}
			select {
			case res := <-done:
				t.Fatalf("the job ended while the fence was renewed: %+v", res)
			default:
			}
			if f.Fired() || gone(p.Pid()) {
				t.Fatalf("fired %v, job gone %v: want a quiet fence while renewed", f.Fired(), gone(p.Pid()))
			}
			waitKilled(t, done, after+10*time.Second)
			if took := time.Since(renewed); took < after {
				t.Errorf("the job was killed %s after the last renewal, before the fence's %s", took, after)
			}
			if !f.Fired() {
				t.Error("the job was killed, yet the fence says it did not fire")
			}
			if err := f.Renew(); err == nil {
				t.Error("Renew of a fence that fired succeeded")
			}
			if err := f.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})

		t.Run("stopped", func(t *testing.T) {
			f, err := m.StartFence(time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if err := unix.Kill(f.cmd.Process.Pid, unix.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			// Its pipe fills; the renewal that finds it full fails, within renewTimeout, and kills it.
			var renewErr error
			for i := 0; i < 1<<20 && renewErr == nil; i++ {
				renewErr = f.Renew()
			}
			if renewErr == nil {
				t.Fatal("a fence that does not read was renewed 1 MiB of times")
			}
			closed := make(chan error, 1)
			go func() { closed <- f.Close() }()
			select {
			case err := <-closed:
				t.Logf("Renew: %v; Close: %v", renewErr, err)
			case <-time.After(10 * time.Second):
				t.Fatal("Close of a fence that did not read still waits 10 s later")
			}
		})

		t.Run("eof", func(t *testing.T) {
			p, done := startSleeper(t, m, "fenced-eof")
			f, err := m.StartFence(time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			// Close waited for the fence, which kills before it exits.
			if !gone(p.Pid()) {
				t.Error("the job's process outlived the fence's end")
			}
			waitKilled(t, done, 10*time.Second)
			if f.Fired() {
				t.Error("a fence that was closed says it fired")
			}
		})
	})
}
