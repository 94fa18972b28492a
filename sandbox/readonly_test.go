package sandbox

import (
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
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// TestBwrapArgs holds the readonly argv to testdata/bwrap_args.golden, one argument a line.
func TestBwrapArgs(t *testing.T) {
	got := strings.Join(bwrapArgs("/home/dev/app", seccompFD, []string{"/bin/sh", "-c", "git log | head"}), "\n") + "\n"
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

// buildProbe compiles testdata/probe.c into a temporary directory, which the sandbox can read.
func buildProbe(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: the probes are C programs")
	}
	src, err := filepath.Abs(filepath.Join("testdata", "probe.c"))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "probe")
	if out, err := exec.Command("gcc", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin
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
	probe := buildProbe(t)

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
	if err := os.WriteFile(filepath.Join(cwd, "data.txt"), []byte("content\n"), 0o644); err != nil {
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
// does not start or is missing.
func TestProbeReadonly(t *testing.T) {
	requireReadonly(t)
	broken := filepath.Join(t.TempDir(), "bwrap")
	if err := os.WriteFile(broken, []byte("#!/bin/sh\necho 'bwrap: cannot start' >&2\nexit 1\n"), 0o755); err != nil {
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
