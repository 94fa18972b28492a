package sandbox

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sbx-dev/sbx/sandbox/sandboxtest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestBwrapArgs holds the readonly argv to testdata/bwrap_args.golden, one argument a line, followed
// by the --args file that gives the job its environment (bwrapEnv), one NUL-terminated item a line.
func TestBwrapArgs(t *testing.T) {
	hide := []hidden{{path: "/etc/sbx", dir: true}, {path: "/root/.sbx-token"}}
	got := strings.Join(bwrapArgs("/home/dev/app", seccompFD, argsFD, hide, []string{"/bin/sh", "-c", "git log | head"}), "\n") + "\n"
	env := bwrapEnv([]string{"PATH=/usr/bin:/bin", "LD_PRELOAD=/home/dev/x.so", "EMPTY=", "A=b=c", "NOVALUE", "PATH=/bin"})
	got += "--- --args file ---\n" + strings.ReplaceAll(string(env), "\x00", "\n")
	golden := filepath.Join("testdata", "bwrap_args.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("bwrap argv:\n%s\nwant (%s):\n%s", got, golden, want)
	}
}

// requireReadonly skips unless readonly jobs can run here: bwrap on PATH and a cgo build.
func requireReadonly(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bwrap not installed (apt-get install bubblewrap)")
	}
	if _, err := compileSeccomp(readonlyFilter); errors.Is(err, ErrNoSeccomp) {
		t.Skip("built without cgo: readonly jobs are refused")
	} else if err != nil {
		t.Fatal(err)
	}
}

// readonlyRun runs script readonly in dir with env and returns its exit code and output.
func readonlyRun(t *testing.T, m *Manager, dir, script string, env ...string) (int, string) {
	t.Helper()
	spec := sh(fmt.Sprintf("ro-%d", time.Now().UnixNano()), script)
	spec.Dir, spec.Readonly = dir, true
	spec.Env = append(spec.Env, env...)
	res, out := run(t, m, spec)
	return res.ExitCode, out
}

// TestReadonly runs each thing a readonly job must (not) be able to do inside the real sandbox, on
// every cgroup version this machine has.
func TestReadonly(t *testing.T) {
	requireReadonly(t)
	probe := sandboxtest.Probe(t)

	// A listener on the host's loopback, which the job must not reach.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)

	// Reading: a file and a git repository.
	cwd := t.TempDir()
	data := filepath.Join(cwd, "data.txt")
	if err := os.WriteFile(data, []byte("content\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	repo := t.TempDir()
	if _, err := exec.LookPath("git"); err == nil {
		for _, args := range [][]string{{"init", "-q"}, {"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--allow-empty", "-m", "first commit"}} {
			cmd := exec.Command("git", args...)
			cmd.Dir = repo
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("git %v: %v\n%s", args, err, out)
			}
		}
	}
	t.Setenv("SANDBOX_TEST_SECRET", "leak")
	i386Native := i386Delivered(t, probe)
	// A cgroup outside every job, for clone3(CLONE_INTO_CGROUP): the cgroup2 root.
	v2Root, noV2 := "/sys/fs/cgroup/unified", ""
	switch cgroups.Mode() {
	case cgroups.Unified:
		v2Root = "/sys/fs/cgroup"
	case cgroups.Legacy:
		noV2 = "no cgroup2 mount to aim clone3 at"
	}
	noPython := ""
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		noPython = "python3 not installed in /usr/bin"
	}
	goBin, err := exec.LookPath("go")
	noGo := ""
	if err != nil {
		noGo = "go not on PATH"
	}

	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		written := func(name string) string { return name + "-" + cfg.Version }
		tests := []struct {
			name   string
			dir    string
			script string
			code   int    // -1: any non-zero
			out    string // "*": any
			absent string // a file that must not exist afterwards
			skip   string
		}{
			{name: "write root", script: "touch /" + written("sbx-ro-test"), code: -1, out: "*", absent: "/" + written("sbx-ro-test")},
			{name: "write tmp", script: "echo x > /tmp/" + written("sbx-ro-test"), code: -1, out: "*", absent: "/tmp/" + written("sbx-ro-test")},
			{name: "write cwd", dir: cwd, script: "touch " + written("created"), code: -1, out: "*", absent: filepath.Join(cwd, written("created"))},
			{name: "mkdir cwd", dir: cwd, script: "mkdir " + written("dir"), code: -1, out: "*", absent: filepath.Join(cwd, written("dir"))},
			{name: "socket AF_UNIX", script: probe + " unix", code: 1, out: "errno 1\n"},
			{name: "socket AF_UNIX high bits", script: probe + " unix-high", code: 1, out: "errno 1\n"},
			{name: "socketpair AF_UNIX DGRAM", script: probe + " socketpair-dgram", code: 1, out: "errno 1\n"},
			{name: "socket AF_INET", script: probe + " inet", code: 0, out: "ok\n"},
			{name: "connect host loopback", script: probe + " connect " + port, code: 1, out: "*"},
			{name: "io_uring_setup", script: probe + " io_uring_setup", code: 1, out: "errno 1\n"},
			{name: "io_uring_enter", script: probe + " io_uring_enter", code: 1, out: "errno 1\n"},
			{name: "io_uring_register", script: probe + " io_uring_register", code: 1, out: "errno 1\n"},
			{name: "x32", script: probe + " x32", code: 159, out: "*"},
			{name: "i386 int 0x80", script: probe + " i386", code: 159, out: "*", skip: i386Native},
			{name: "descriptors", script: probe + " fds", code: 0, out: "0\n1\n2\n"},
			{name: "socket AF_VSOCK", script: probe + " vsock", code: 1, out: "errno 1\n"},
			{name: "socket AF_VSOCK high bits", script: probe + " vsock-high", code: 1, out: "errno 1\n"},
			{name: "add_key", script: probe + " add_key", code: 1, out: "errno 1\n"},
			{name: "keyctl", script: probe + " keyctl", code: 1, out: "errno 1\n"},
			{name: "request_key", script: probe + " request_key", code: 1, out: "errno 1\n"},
			{name: "flock", script: probe + " flock " + data, code: 1, out: "errno 1\n"},
			{name: "F_SETLEASE", script: probe + " lease " + data, code: 1, out: "errno 1\n"},
			{name: "F_SETLEASE high bits", script: probe + " lease-high " + data, code: 1, out: "errno 1\n"},
			{name: "POSIX read lock", script: probe + " setlk " + data, code: 0, out: "ok\n"},
			{name: "clone3", script: probe + " clone3", code: 1, out: "errno 38\n"},
			{name: "clone3 into a host cgroup", script: probe + " clone3-cgroup " + v2Root, code: 1, out: "errno 38\n", skip: noV2},
			{name: "user namespace", script: probe + " userns", code: 1, out: "*"},
			{name: "sysctl fs.lease-break-time", script: probe + " open-write /proc/sys/fs/lease-break-time", code: 1, out: "errno 30\n"},
			{name: "sysctl kernel.core_pattern", script: probe + " open-write /proc/sys/kernel/core_pattern", code: 1, out: "errno 30\n"},
			// glibc's pthread_create and posix_spawn try clone3 first and fall back to clone on ENOSYS.
			{name: "python threads and subprocess", script: `python3 -u -c 'import subprocess, threading
t = threading.Thread(target=print, args=("thread",)); t.start(); t.join()
subprocess.run(["echo", "child"])'`, code: 0, out: "thread\nchild\n", skip: noPython},
			{name: "go", script: goBin + " version >/dev/null && echo ran", code: 0, out: "ran\n", skip: noGo},
			{name: "find and grep", script: "find /etc -maxdepth 1 -name passwd -exec grep -c '^root:' {} +", code: 0, out: "1\n"},
			{name: "runner env", script: "echo ${SANDBOX_TEST_SECRET:-unset}", code: 0, out: "unset\n"},
			{name: "cat and ls", dir: cwd, script: "cat data.txt && ls", code: 0, out: "content\ndata.txt\n"},
			{name: "git log", dir: repo, script: "git log --format=%s", code: 0, out: "first commit\n"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if tt.skip != "" {
					t.Skip(tt.skip)
				}
				if tt.name == "git log" {
					if _, err := exec.LookPath("git"); err != nil {
						t.Skip("git not installed")
					}
				}
				dir := tt.dir
				if dir == "" {
					dir = "/"
				}
				code, out := readonlyRun(t, m, dir, tt.script)
				if tt.code == -1 && code == 0 || tt.code >= 0 && code != tt.code {
					t.Errorf("exit code %d, want %d; output %q", code, tt.code, out)
				}
				if tt.out != "*" && out != tt.out {
					t.Errorf("output %q, want %q", out, tt.out)
				}
				if tt.absent != "" {
					if _, err := os.Lstat(tt.absent); !errors.Is(err, os.ErrNotExist) {
						os.RemoveAll(tt.absent)
						t.Errorf("%s exists after the job (%v)", tt.absent, err)
					}
				}
			})
		}
		t.Run("proc", func(t *testing.T) {
			code, out := readonlyRun(t, m, "/", "cat /proc/1/comm; ls /proc")
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if code != 0 || len(lines) == 0 || lines[0] != "bwrap" {
				t.Fatalf("exit code %d, output %q: want pid 1 to be bwrap", code, out)
			}
			var pids []int
			for _, l := range lines[1:] {
				if n, err := strconv.Atoi(l); err == nil {
					pids = append(pids, n)
				}
			}
			// bwrap as pid 1, sh, ls (and cat, gone by then): nothing of the host.
			if len(pids) > 4 || !slices.Contains(pids, 1) || slices.Max(pids) > 10 {
				t.Errorf("/proc shows pids %v, want only the sandbox's few", pids)
			}
		})
	})
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host's loopback listener accepted %d connections from readonly jobs", n)
	}
}

// i386Delivered runs the i386 probe outside the sandbox: "" when the kernel delivers int 0x80
// syscalls, else why the i386 case must be skipped (a kernel without IA32 emulation, or a hypervisor
// that does not pass int 0x80, kills the probe with SIGSEGV before any filter sees the call).
func i386Delivered(t *testing.T, probe string) string {
	t.Helper()
	out, err := exec.Command(probe, "i386").CombinedOutput()
	if err == nil && strings.TrimSpace(string(out)) == "ok" {
		return ""
	}
	return fmt.Sprintf("this kernel does not deliver i386 int 0x80 syscalls (unsandboxed probe: %v, %q)", err, out)
}

// TestProbeReadonly: the probe passes with the real bwrap and fails, saying why, with a bwrap that
// does not start, is missing, or runs with the job's environment.
func TestProbeReadonly(t *testing.T) {
	requireReadonly(t)
	broken := filepath.Join(t.TempDir(), "bwrap")
	if err := os.WriteFile(broken, []byte("#!/bin/sh\necho 'bwrap: cannot start' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	real, err := exec.LookPath("bwrap")
	if err != nil {
		t.Fatal(err)
	}
	// A bwrap started with the job's environment, as before: it exports the --setenv pairs of its
	// --args file (opened anew through /proc, so that bwrap still reads it from the start).
	leaky := filepath.Join(t.TempDir(), "bwrap")
	script := fmt.Sprintf(`#!/bin/sh
eval "$(tr '\0' '\n' </proc/self/fd/%d | awk 'NR%%3==2 { k = $0 } NR%%3==0 { printf "export %%s='%%s'\n", k, $0 }')"
exec %s "$@"
`, argsFD, real)
	if err := os.WriteFile(leaky, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		bwrap string
		want  string // "" means the probe passes
	}{
		{"bwrap", "", ""},
		{"bwrap exits 1", broken, "exit code 1: bwrap: cannot start"},
		{"bwrap missing", "/nonexistent/bwrap", "find bwrap"},
		{"bwrap with the job's environment", leaky, "reached the loader outside the sandbox"},
	}
	eachVersion(t, func(t *testing.T, cfg Config) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				cfg := cfg
				cfg.Bwrap = tt.bwrap
				m, _ := newTestManager(t, cfg)
				err := m.ProbeReadonly(context.Background())
				switch {
				case tt.want == "" && err != nil:
					t.Fatalf("ProbeReadonly: %v", err)
				case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
					t.Fatalf("ProbeReadonly = %v, want an error containing %q", err, tt.want)
				}
				// A readonly job on a Manager whose probe failed still never runs outside bwrap.
				if tt.want != "" {
					marker := filepath.Join(t.TempDir(), "ran")
					spec := sh("ro-after-failed-probe", "touch "+marker)
					spec.Readonly = true
					if p, err := m.Start(spec); err == nil {
						drain(t, p.Output())()
						p.Wait()
					}
					if _, err := os.Stat(marker); err == nil {
						t.Fatal("a readonly job ran unsandboxed")
					}
				}
			})
		}
	})
}

// TestReadonlySharedMount: a mount the host makes while a readonly job runs, under a shared mount the
// job sees, does not reach the sandbox (bwrap's own mounts are slaves, which would receive it
// writable), on the cold and warm v1 paths and on v2.
func TestReadonlySharedMount(t *testing.T) {
	requireReadonly(t)
	shared, sub := sandboxtest.SharedMount(t)
	var configs []Config
	for _, cfg := range testConfigs(t) {
		configs = append(configs, cfg)
		if cfg.Version == "v1" {
			cold := cfg
			cold.Warm = -1
			configs = append(configs, cold)
		}
	}
	for _, cfg := range configs {
		name := cfg.Version
		if cfg.Warm < 0 {
			name += "-cold"
		}
		t.Run(name, func(t *testing.T) {
			m, _ := newTestManager(t, cfg)
			if m.warm != nil {
				waitWarm(t, m) // the job takes a warm init step
			}
			marker := filepath.Join(shared, "mounted-"+name)
			spec := sh("ro-shared-"+name, fmt.Sprintf(
				"echo ready; while [ ! -e %s ]; do sleep 0.02; done; echo x > %s/f && echo wrote; ls %s",
				marker, sub, sub))
			spec.Readonly = true
			p, err := m.Start(spec)
			if err != nil {
				t.Fatal(err)
			}
			// Once the job has said ready its sandbox is set up: a mount made now comes after bwrap's
			// --ro-bind / /, which would have made it read-only had it been there before.
			r := bufio.NewReader(p.Output())
			if line, err := r.ReadString('\n'); line != "ready\n" {
				p.Kill()
				t.Fatalf("job said %q, %v", line, err)
			}
			if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
				p.Kill()
				t.Fatalf("mount tmpfs: %v", err)
			}
			defer unix.Unmount(sub, unix.MNT_DETACH)
			if err := os.WriteFile(marker, nil, 0o644); err != nil {
				p.Kill()
				t.Fatal(err)
			}
			defer os.Remove(marker)
			out := drain(t, r)
			if _, err := p.Wait(); err != nil {
				t.Errorf("Wait: %v", err)
			}
			if got := out(); strings.Contains(got, "wrote") {
				t.Errorf("the job wrote into a tmpfs the host mounted while it ran: %q", got)
			}
			if _, err := os.Stat(filepath.Join(sub, "f")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s/f exists on the host (%v)", sub, err)
			}
		})
	}
}

// TestReadonlyHide: Config.Hide covers a directory (and what is under it), a file and a symlink's
// target from readonly jobs, skips a path that does not exist, and hides nothing from plain jobs.
func TestReadonlyHide(t *testing.T) {
	requireReadonly(t)
	const secret = "TOPSECRET"
	secrets, other, linked := t.TempDir(), t.TempDir(), t.TempDir()
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(secrets, "creds"), secret+"-dir\n")
	write(filepath.Join(secrets, "sub", "deep"), secret+"-deep\n")
	token := filepath.Join(other, "token")
	write(token, secret+"-file\n")
	write(filepath.Join(linked, "f"), secret+"-linked\n")
	link := filepath.Join(other, "link")
	if err := os.Symlink(linked, link); err != nil {
		t.Fatal(err)
	}
	write(filepath.Join(other, "visible"), "shown\n")
	hide := []string{secrets, filepath.Join(secrets, "sub"), token, link, filepath.Join(other, "missing")}
	// Each cat but the last fails: a hidden directory is empty, a hidden file cannot be opened (it is
	// /dev/null on a nodev mount).
	script := fmt.Sprintf("{ cat %s/creds %s/sub/deep %s %s/f %s/visible; ls -A %s | wc -l; touch %s/x || echo refused; } 2>/dev/null",
		secrets, secrets, token, linked, other, secrets, secrets)
	eachVersion(t, func(t *testing.T, cfg Config) {
		cfg.Hide = hide
		m, _ := newTestManager(t, cfg)
		code, out := readonlyRun(t, m, "/", script)
		if code != 0 || strings.Contains(out, secret) || out != "shown\n0\nrefused\n" {
			t.Errorf("readonly job: exit code %d, output %q; want %q", code, out, "shown\n0\nrefused\n")
		}
		res, out := run(t, m, sh("plain-hide", "cat "+filepath.Join(secrets, "creds")+" "+token))
		if res.ExitCode != 0 || out != secret+"-dir\n"+secret+"-file\n" {
			t.Errorf("plain job: exit code %d, output %q; want the secrets", res.ExitCode, out)
		}
	})
}

// TestHideConfig: NewManager refuses a Hide path that is not absolute and clean, or is /.
func TestHideConfig(t *testing.T) {
	for _, p := range []string{"", "etc/sbx", "/etc/../sbx", "/etc/sbx/", "/", "/etc//sbx"} {
		_, err := NewManager(Config{Root: "sbx-test-hide", Hide: []string{"/ok", p}})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "hide") {
			t.Errorf("Hide %q: %v, want ErrInvalidConfig naming hide", p, err)
		}
	}
}

// TestReadonlyLimits: a readonly job cannot lift its own memory limit by mounting its cgroup from a
// user namespace of its own (there it would hold every capability, and it owns the cgroup's files);
// the limit holds and the usage is accounted, through bwrap's user namespace.
func TestReadonlyLimits(t *testing.T) {
	requireReadonly(t)
	probe := sandboxtest.Probe(t)
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		lift := probe + " cgroup-lift cgroup2 memory.max max"
		if cfg.Version == "v1" {
			// memsw first: v1 keeps memory.memsw.limit_in_bytes >= memory.limit_in_bytes.
			lift = probe + " cgroup-lift memory memory.memsw.limit_in_bytes -1; " + probe + " cgroup-lift memory memory.limit_in_bytes -1"
		}
		spec := sh("ro-lift", lift+"; "+probe+" alloc 256")
		spec.Readonly = true
		limit := int64(64 << 20)
		spec.Resources = &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit, Swap: &limit}}
		p, err := m.Start(spec)
		if errors.Is(err, ErrNoController) {
			t.Skipf("no memory controller: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		out := drain(t, p.Output())
		res, err := p.Wait()
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		if got := out(); !res.OOMKilled || strings.HasPrefix(got, "ok") {
			t.Errorf("exit code %d, OOM killed %v, output %q: want the lift refused and the job OOM killed", res.ExitCode, res.OOMKilled, got)
		}
		// The usage is accounted as for a plain job: the peak is the limit the job ran into.
		if res.MemoryPeak < uint64(limit)/2 || res.CPU <= 0 {
			t.Errorf("usage: peak %d bytes, CPU %v; want about %d bytes and some CPU", res.MemoryPeak, res.CPU, limit)
		}
	})
}

// TestProbeUnsandboxed: outside the sandbox the probe fails and names each check that the host does
// not refuse by itself, so that a sandbox missing any one rule fails the probe. (ProbeReadonly passing
// in the sandbox is TestProbeReadonly.)
func TestProbeUnsandboxed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("as another user than root, / and /proc/sys are not writable anyway")
	}
	var out strings.Builder
	if code := probe(&out); code != 1 {
		t.Fatalf("probe exit code %d, output %q", code, out.String())
	}
	for _, c := range probeChecks() {
		if err := c.call(); c.refused(err) {
			t.Logf("%s: this host refuses it by itself (%v)", c.what, err)
			continue
		}
		if !strings.Contains(out.String(), c.what+": ") {
			t.Errorf("probe output does not name %q: %s", c.what, out.String())
		}
	}
}
