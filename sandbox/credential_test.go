package sandbox

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// nobody is the credential of the user every Linux system has.
func nobody() *Credential {
	return &Credential{UID: 65534, GID: 65534, Groups: []uint32{65534, 100}}
}

// procUID reads the real uid of a running process.
func procUID(t testing.TB, pid int) uint32 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			uid, err := strconv.ParseUint(strings.Fields(rest)[0], 10, 32)
			if err != nil {
				t.Fatal(err)
			}
			return uint32(uid)
		}
	}
	t.Fatalf("no Uid line in /proc/%d/status", pid)
	return 0
}

// TestCredential: a job with a Credential runs as that user and groups, inside its cgroup (it joined
// before dropping), cannot read what only root can, and is still killed and accounted as a whole; on
// every cgroup version, from a cold and (v1) a warm start.
func TestCredential(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		for _, warm := range []int{-1, 0} {
			name := "cold"
			if warm == 0 {
				name = "warm"
			}
			t.Run(name, func(t *testing.T) {
				cfg := cfg
				cfg.Warm = warm
				m, cfg := newTestManager(t, cfg)
				if warm == 0 {
					if m.warm == nil {
						t.Skip("no warm init steps here (v2, or no cgo)")
					}
					waitWarm(t, m)
				}
				arg := daemonArg()
				spec := sh("as-nobody", `id -u; id -g; id -G; grep -c ":/`+cfg.Root+`/as-nobody$" /proc/self/cgroup; cat /etc/shadow >/dev/null 2>&1 && echo read-shadow; setsid sleep `+arg+` & echo $!`)
				spec.Credential = nobody()
				res, out := run(t, m, spec)
				lines := strings.Split(strings.TrimSpace(out), "\n")
				if res.ExitCode != 0 || len(lines) != 5 {
					t.Fatalf("exit %d, output %q", res.ExitCode, out)
				}
				if lines[0] != "65534" || lines[1] != "65534" || lines[2] != "65534 100" {
					t.Errorf("uid, gid, groups = %q, want 65534, 65534, 65534 100", lines[:3])
				}
				if n, _ := strconv.Atoi(lines[3]); n < 1 {
					t.Errorf("the job is not in its own cgroup: %q", out)
				}
				if _, err := strconv.Atoi(lines[4]); err != nil {
					t.Fatalf("output %q", out)
				}
				if pids := survivors(t, arg); len(pids) > 0 {
					t.Errorf("the job's daemon %v outlived it", pids)
				}
			})
		}
	})
}

// TestCredentialStartFails: a credential the job cannot use (a directory it may not enter) fails the
// start with the reason, and leaves no cgroup behind.
func TestCredentialStartFails(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		cfg.Warm = -1
		m, _ := newTestManager(t, cfg)
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		spec := sh("no-entry", "pwd")
		spec.Dir = dir
		spec.Credential = nobody()
		p, err := m.Start(spec)
		if err == nil {
			out := drain(t, p.Output())
			res, _ := p.Wait()
			t.Fatalf("Start in a directory nobody cannot enter succeeded: %+v %q", res, out())
		}
		if !strings.Contains(strings.ToLower(err.Error()), "permission denied") {
			t.Errorf("Start = %v, want permission denied", err)
		}
		if left, err := jobCgroups(m); err != nil || len(left) != 0 {
			t.Errorf("cgroups left after failed start: %v, %v", left, err)
		}
	})
}

// TestCredentialReadonly: a readonly job with a credential runs bwrap as that user (bwrap then uses
// an unprivileged user namespace) and is confined as a root one is.
func TestCredentialReadonly(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		if _, err := m.ro.get(m.bwrap); err != nil {
			t.Skipf("readonly jobs cannot run here: %v", err)
		}
		spec := sh("ro-nobody", `id -u; touch /tmp/sbx-ro-nobody 2>/dev/null && echo wrote; cat /etc/shadow >/dev/null 2>&1 && echo read-shadow; echo done`)
		spec.Readonly = true
		spec.Credential = nobody()
		res, out := run(t, m, spec)
		if res.ExitCode != 0 || out != "65534\ndone\n" {
			t.Errorf("exit %d, output %q; want 65534 and done only", res.ExitCode, out)
		}
	})
}
