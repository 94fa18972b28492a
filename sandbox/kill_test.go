package sandbox

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-dev/sbx/internal/poll"
)

// TestKillGraceCoversJob: a kill's SIGTERM reaches every process of the job, also one in its own
// session, and the grace before SIGKILL holds for them after the main shell has died of the TERM.
func TestKillGraceCoversJob(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		cfg.KillGrace = 3 * time.Second
		m, _ := newTestManager(t, cfg)
		script := `(trap 'sleep 0.4; echo child cleaned up; exit 0' TERM; while :; do sleep 0.05; done) &
setsid sh -c 'trap "echo daemon got TERM; exit 0" TERM; while :; do sleep 0.05; done' &
echo started; wait`
		p, err := m.Start(sh("grace", script))
		if err != nil {
			t.Fatal(err)
		}
		out := drain(t, p.Output())
		poll.Until(t, 5*time.Second, "the child and the daemon trap TERM", func() bool {
			daemons, job := sigTERM(t, p, "SigCgt")
			return daemons > 0 && job > 0
		})
		t0 := time.Now()
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
		res, err := p.Wait()
		took := time.Since(t0)
		if err != nil {
			t.Fatal(err)
		}
		got := out()
		for _, want := range []string{"started", "child cleaned up", "daemon got TERM"} {
			if !strings.Contains(got, want) {
				t.Errorf("output %q lacks %q (result %+v)", got, want, res)
			}
		}
		// The job ends when its last process exits, not at the end of the grace.
		if took > 2*time.Second {
			t.Errorf("the kill took %s; everything had exited after about 0.4 s", took)
		}
	})
}

// TestKillGraceEnds: what ignores SIGTERM is killed when the grace ends, main process or not.
func TestKillGraceEnds(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		cfg.KillGrace = 300 * time.Millisecond
		m, _ := newTestManager(t, cfg)
		p, err := m.Start(sh("stubborn", `setsid sh -c 'trap "" TERM; while :; do sleep 0.05; done' & echo started; wait`))
		if err != nil {
			t.Fatal(err)
		}
		out := drain(t, p.Output())
		poll.Until(t, 5*time.Second, "the daemon ignores TERM", func() bool { daemons, _ := sigTERM(t, p, "SigIgn"); return daemons > 0 })
		t0 := time.Now()
		p.Kill()
		if _, err := p.Wait(); err != nil {
			t.Fatal(err)
		}
		out()
		if took := time.Since(t0); took < 250*time.Millisecond || took > 5*time.Second {
			t.Errorf("the kill took %s, want about the grace (300 ms)", took)
		}
	})
}

// TestLingerCgroup: a job that lingers until its cgroup is empty outlives its shell while a daemon
// that closed its output runs (Linger alone lets that one go, and kills it), ends when the daemon
// exits, and ends at once when killed, the daemon with it.
func TestLingerCgroup(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		spec := sh("linger-cgroup", `nohup setsid sh -c 'sleep 0.5' >/dev/null 2>&1 & echo started`)
		spec.LingerCgroup = true
		t0 := time.Now()
		if res, out := run(t, m, spec); res.ExitCode != 0 || out != "started\n" {
			t.Errorf("linger cgroup: %+v %q", res, out)
		}
		if took := time.Since(t0); took < 400*time.Millisecond || took > 5*time.Second {
			t.Errorf("the job took %s, want about the daemon's 0.5 s", took)
		}

		// The daemon is found on the host by its argument: the job's $! is its pid in the job's own
		// pid namespace.
		arg := daemonArg()
		spec = sh("linger-cgroup-kill", `nohup setsid sleep `+arg+` >/dev/null 2>&1 & echo started`)
		spec.LingerCgroup = true
		p, err := m.Start(spec)
		if err != nil {
			t.Fatal(err)
		}
		drain(t, p.Output())
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.Wait()
		}()
		select {
		case <-done:
			t.Fatal("the job ended while its daemon ran")
		case <-time.After(300 * time.Millisecond):
		}
		if d := survivors(t, arg); len(d) != 1 {
			t.Fatalf("daemons running before the kill: %v, want one", d)
		}
		p.Kill()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a killed job did not end")
		}
		if d := survivors(t, arg); len(d) != 0 {
			t.Errorf("daemon %v survived the kill", d)
		}
	})
}

// TestLinger: a lingering job lasts until its output closes: a background child still printing is
// waited for (without Linger it is killed when the shell exits); one that closed its output is not;
// a kill ends a lingering job whose shell has exited.
func TestLinger(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		const script = `(sleep 0.3; echo late) & echo early`
		spec := sh("linger", script)
		spec.Linger = true
		if res, out := run(t, m, spec); res.ExitCode != 0 || out != "early\nlate\n" {
			t.Errorf("linger: %+v %q, want early and late", res, out)
		}
		if _, out := run(t, m, sh("no-linger", script)); out != "early\n" {
			t.Errorf("without linger: %q, want early only", out)
		}

		spec = sh("linger-daemon", `sleep 100 >/dev/null 2>&1 & echo $!`)
		spec.Linger = true
		t0 := time.Now()
		_, out := run(t, m, spec)
		if took := time.Since(t0); took > 5*time.Second {
			t.Errorf("a daemon with its output closed held the job %s", took)
		}
		if pid := strings.TrimSpace(out); pid == "" {
			t.Errorf("output %q", out)
		}

		spec = sh("linger-kill", `(while :; do echo tick; sleep 0.05; done) & exit 0`)
		spec.Linger = true
		p, err := m.Start(spec)
		if err != nil {
			t.Fatal(err)
		}
		drained := drain(t, p.Output())
		// Let the shell exit and its child tick: the output, read only at the end, shows no tick before.
		time.Sleep(200 * time.Millisecond)
		p.Kill()
		res, err := p.Wait()
		if err != nil || res.ExitCode != 0 {
			t.Errorf("killed lingering job: %+v, %v (the main process's own exit code is 0)", res, err)
		}
		if !strings.Contains(drained(), "tick") {
			t.Error("no output from the lingering child")
		}
	})
}

// sigTERM counts the processes of p's cgroup whose signal mask field of /proc/PID/status (SigCgt:
// caught, SigIgn: ignored) holds SIGTERM, where a trap set is seen: those that lead a session of
// their own (a setsid daemon), and those in the session of p's main process. A shell's child forked
// and not yet exec'd holds its shell's trap: a daemon's is in neither count, a job shell's counts
// only once that shell set it.
func sigTERM(t testing.TB, p *Process, field string) (daemons, job int) {
	t.Helper()
	jobSid, err := unix.Getsid(p.Pid())
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range groupPids(t, p) {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			continue // exited since the list
		}
		for _, line := range strings.Split(string(b), "\n") {
			hex, ok := strings.CutPrefix(line, field+":")
			if !ok {
				continue
			}
			mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil || mask&(1<<(syscall.SIGTERM-1)) == 0 {
				continue
			}
			switch sid, err := unix.Getsid(pid); {
			case err != nil:
			case sid == pid:
				daemons++
			case sid == jobSid:
				job++
			}
		}
	}
	return daemons, job
}
