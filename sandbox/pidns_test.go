package sandbox

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/internal/poll"
)

// TestJobsIsolated: a plain job cannot see, read or signal another job's processes, though both run
// as the same user. Before, a job listed the other's pid in /proc, read its environment (a secret
// passed in env) from /proc/PID/environ and killed it.
func TestJobsIsolated(t *testing.T) {
	for name, cfg := range envConfigs(t) {
		t.Run(name, func(t *testing.T) {
			m, _ := newTestManager(t, cfg)
			if m.warm != nil {
				waitWarm(t, m)
			}
			secret := fmt.Sprintf("topsecret-%d", time.Now().UnixNano())
			victim := sh("victim-"+name, "echo ready; while :; do sleep 0.05; done")
			victim.Env = append(victim.Env, "SECRET="+secret)
			p, err := m.Start(victim)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				p.Kill()
				p.Wait()
			}()
			r := bufio.NewReader(p.Output())
			if line, err := r.ReadString('\n'); line != "ready\n" {
				t.Fatalf("victim said %q, %v", line, err)
			}
			pid := strconv.Itoa(p.Pid())
			// The victim's pid as the host sees it, and every pid the job finds in /proc.
			script := fmt.Sprintf(`ls -d /proc/[0-9]* | wc -l
test -e /proc/%[1]s && echo sees-pid
cat /proc/%[1]s/environ 2>/dev/null | tr '\0' '\n' | grep SECRET
for e in /proc/[0-9]*/environ; do tr '\0' '\n' <$e; done 2>/dev/null | grep -c SECRET
kill -9 %[1]s 2>/dev/null && echo killed-pid
kill -9 -%[1]s 2>/dev/null && echo killed-group
true`, pid)
			res, out := run(t, m, sh("attacker-"+name, script))
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if res.ExitCode != 0 || len(lines) != 2 {
				t.Fatalf("attacker: exit code %d, output %q; want its process count and 0 and nothing else", res.ExitCode, out)
			}
			// The attacker's init, its shell, ls and wc (the subshell of the pipeline) at most.
			if n, err := strconv.Atoi(lines[0]); err != nil || n > 5 {
				t.Errorf("the attacker sees %s processes in /proc, want only its own few", lines[0])
			}
			if lines[1] != "0" {
				t.Errorf("the attacker read %s environments holding SECRET", lines[1])
			}
			if strings.Contains(out, secret) {
				t.Errorf("the attacker read the victim's secret: %q", out)
			}
			if err := p.Signal(0); err != nil {
				t.Errorf("the victim is gone after the attacker ran: %v", err)
			}
			// A job with every capability (run as root) can unmount its /proc; the host's is not
			// under it.
			res, out = run(t, m, sh("unmount-"+name, "umount /proc && ls -A /proc | wc -l"))
			if res.ExitCode != 0 || out != "0\n" {
				t.Errorf("after umount /proc: exit code %d, output %q; want an empty /proc", res.ExitCode, out)
			}
		})
	}
}

// TestSignalReachesJob: Signal reaches the job's process group through the pid namespace, STOP and
// CONT included (the init cannot relay those), and Pid is the job's shell as the host sees it.
func TestSignalReachesJob(t *testing.T) {
	for name, cfg := range envConfigs(t) {
		t.Run(name, func(t *testing.T) {
			m, _ := newTestManager(t, cfg)
			if m.warm != nil {
				waitWarm(t, m)
			}
			p, err := m.Start(sh("signal-"+name, `trap 'echo got USR1; exit 3' USR1; echo ready; while :; do :; done`))
			if err != nil {
				t.Fatal(err)
			}
			r := bufio.NewReader(p.Output())
			if line, err := r.ReadString('\n'); line != "ready\n" {
				p.Kill()
				t.Fatalf("job said %q, %v", line, err)
			}
			// The host's view of the job's shell: its state, and its name. The shell spins on builtins:
			// a shell waiting for a vfork'd child that the STOP stopped before its exec stays in D.
			state := func() string {
				b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
				if err != nil {
					return err.Error()
				}
				s := string(b)
				return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[0]
			}
			if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p.Pid())); err != nil || string(comm) != "sh\n" {
				t.Errorf("Pid %d on the host is %q, %v; want the job's sh", p.Pid(), comm, err)
			}
			for _, step := range []struct {
				sig  syscall.Signal
				want string
			}{{syscall.SIGSTOP, "T"}, {syscall.SIGCONT, "R"}} {
				if err := p.Signal(step.sig); err != nil {
					t.Fatal(err)
				}
				var st string
				if !poll.Within(5*time.Second, func() bool {
					st = state()
					return st == step.want || step.want == "R" && st == "S"
				}) {
					p.Kill()
					t.Fatalf("after %v the job's shell is in state %s, want %s", step.sig, st, step.want)
				}
			}
			if err := p.Signal(syscall.SIGUSR1); err != nil {
				t.Fatal(err)
			}
			out := drain(t, r)
			res, err := p.Wait()
			if got := out(); err != nil || res.ExitCode != 3 || got != "got USR1\n" {
				t.Errorf("after USR1: %+v, %v, output %q; want exit code 3 and the trap's output", res, err, got)
			}
		})
	}
}
