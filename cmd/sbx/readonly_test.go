package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/sandbox/sandboxtest"
)

// TestReadonlyThroughAPI: a readonly job reads but cannot write, through the whole system.
func TestReadonlyThroughAPI(t *testing.T) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bwrap is not installed")
	}
	s := startServe(t)
	ctx := t.Context()
	rs, err := s.c.Runners(ctx)
	if err != nil || len(rs) != 1 || !rs[0].Readonly {
		t.Fatalf("runner did not pass its probe: %+v, %v", rs, err)
	}
	dir := jobDir(t) // the job's user could write there, but for the sandbox
	target := filepath.Join(dir, "written")
	r, err := s.c.Start(ctx, client.StartRequest{Cwd: dir, Readonly: true, BlockUntil: 10_000_000_000,
		Command: "ls / >/dev/null && echo read ok; touch " + target + " || echo write refused"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Output != "read ok\ntouch: cannot touch '"+target+"': Read-only file system\nwrite refused\n" {
		t.Fatalf("output %q", r.Output)
	}
	if _, err := os.Stat(target); err == nil {
		t.Fatal("a readonly job wrote a file")
	}
}

// TestReadonlyUnavailable: with a bwrap that cannot start, the runner says so, readonly jobs are
// refused at once with readonly_unavailable naming the probe's reason, and nothing runs.
func TestReadonlyUnavailable(t *testing.T) {
	fake := t.TempDir()
	if err := os.WriteFile(filepath.Join(fake, "bwrap"), []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", fake+":"+os.Getenv("PATH"))
	s := startServe(t)
	ctx := t.Context()
	rs, err := s.c.Runners(ctx)
	if err != nil || len(rs) != 1 || rs[0].Readonly || rs[0].ReadonlyReason == "" {
		t.Fatalf("runner with a broken bwrap: %+v, %v", rs, err)
	}
	target := filepath.Join(t.TempDir(), "touched")
	_, err = s.c.Start(ctx, client.StartRequest{Cwd: "/", Readonly: true, Command: "touch " + target})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Code != "readonly_unavailable" || !strings.Contains(apiErr.Message, rs[0].ReadonlyReason) {
		t.Fatalf("readonly start: %v; want readonly_unavailable with the reason %q", err, rs[0].ReadonlyReason)
	}
	if _, err := os.Stat(target); err == nil {
		t.Fatal("the refused readonly command ran")
	}
	out, err := s.sbx(t, "run", "--readonly", "--", "touch", target)
	if code(err) != 1 || out != "" {
		t.Fatalf("sbx run --readonly: exit %d, %q", code(err), out)
	}
}

// TestReadonlyEscapes: each readonly escape of issue 7 fails through the whole system, as a readonly
// job started through the API of `sbx serve` run by root. docs/readonly.md has a row for each. The
// jobs run as root (--allow-root-jobs): the sandbox must hold without the help of an unprivileged user.
func TestReadonlyEscapes(t *testing.T) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		t.Skip("bwrap is not installed")
	}
	probe := sandboxtest.Probe(t)
	s := startServe(t, "--allow-root-jobs")
	ctx := t.Context()
	if rs, err := s.c.Runners(ctx); err != nil || len(rs) != 1 || !rs[0].Readonly {
		t.Fatalf("runner did not pass its probe: %+v, %v", rs, err)
	}
	locked := filepath.Join(t.TempDir(), "locked")
	if err := os.WriteFile(locked, []byte("host file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The job's own memory limit, lifted from a user namespace of its own; v1 keeps
	// memory.memsw.limit_in_bytes (set with the limit) above memory.limit_in_bytes, so it goes first.
	lift := probe + " cgroup-lift cgroup2 memory.max max"
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		lift = probe + " cgroup-lift memory memory.memsw.limit_in_bytes -1; " + probe + " cgroup-lift memory memory.limit_in_bytes -1"
	}
	// A cgroup outside the job: the cgroup2 root (hybrid or unified).
	v2Root := ""
	for _, dir := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err == nil {
			v2Root = dir
			break
		}
	}
	tests := []struct {
		name    string
		command string
		limits  *client.Limits
		reason  string // how the job must end
		out     string // its whole output
	}{
		// The same value written back: harmless had it worked.
		{name: "1 sysctls", command: `v=$(cat /proc/sys/fs/lease-break-time)
(echo "$v" >/proc/sys/fs/lease-break-time) 2>/dev/null && echo wrote fs.lease-break-time
(exec 3>/proc/sys/kernel/core_pattern) 2>/dev/null && echo opened kernel.core_pattern
echo done`, reason: "exit", out: "done\n"},
		{name: "2 cgroup limits", command: lift + "; " + probe + " alloc 256", limits: &client.Limits{MemoryBytes: 64 << 20}, reason: "oom", out: "*"},
		{name: "3 clone3 into a host cgroup", command: probe + " clone3-cgroup " + v2Root, reason: "exit", out: "errno 38\n"},
		{name: "4 session keyring", command: probe + " add_key; " + probe + " keyctl", reason: "exit", out: "errno 1\nerrno 1\n"},
		{name: "5 vsock", command: probe + " vsock", reason: "exit", out: "errno 1\n"},
		{name: "7 flock and lease", command: probe + " flock " + locked + "; " + probe + " lease " + locked, reason: "exit", out: "errno 1\nerrno 1\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if strings.HasPrefix(tt.name, "3 ") && v2Root == "" {
				t.Skip("no cgroup2 mount to aim clone3 at")
			}
			job, out := runReadonly(t, s, tt.command, tt.limits)
			if job.Reason != tt.reason || tt.out != "*" && out != tt.out {
				t.Errorf("status %s, reason %s, output %q; want reason %s, output %q", job.Status, job.Reason, out, tt.reason, tt.out)
			}
		})
	}
	t.Run("6 mount under a shared mount", func(t *testing.T) {
		shared, sub := sandboxtest.SharedMount(t)
		marker := filepath.Join(shared, "mounted")
		r, err := s.c.Start(ctx, client.StartRequest{Cwd: "/", Readonly: true, Limits: &client.Limits{TimeoutMS: 30_000},
			Command: fmt.Sprintf("echo ready; while [ ! -e %s ]; do sleep 0.02; done; echo x > %s/f && echo wrote; echo done", marker, sub)})
		if err != nil {
			t.Fatal(err)
		}
		// Once the job said ready its sandbox is set up: bwrap's --ro-bind / / would have made a
		// mount read-only that was there before.
		if w, err := s.c.Wait(ctx, r.Job.ID, 20*time.Second, "ready"); err != nil || !w.PatternMatched {
			t.Fatalf("wait for ready: %+v, %v", w, err)
		}
		if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatalf("mount tmpfs: %v", err)
		}
		t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
		if err := os.WriteFile(marker, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		job, out := waitJob(t, s, r.Job.ID)
		if job.Reason != "exit" || strings.Contains(out, "wrote") || !strings.HasSuffix(out, "done\n") {
			t.Errorf("reason %s, output %q; want the write refused", job.Reason, out)
		}
		if _, err := os.Stat(filepath.Join(sub, "f")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s/f exists on the host (%v)", sub, err)
		}
	})
}

// runReadonly runs command as a readonly job in / and returns the ended job and its output.
func runReadonly(t *testing.T, s *instance, command string, limits *client.Limits) (client.Job, string) {
	t.Helper()
	r, err := s.c.Start(t.Context(), client.StartRequest{Cwd: "/", Readonly: true, Command: command, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	return waitJob(t, s, r.Job.ID)
}

// waitJob waits for job id to end and returns it and its output.
func waitJob(t *testing.T, s *instance, id string) (client.Job, string) {
	t.Helper()
	w, err := s.c.Wait(t.Context(), id, 30*time.Second, "")
	if err != nil || !w.Done {
		t.Fatalf("wait: %+v, %v", w, err)
	}
	out, _, err := s.c.Output(t.Context(), id, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	return w.Job, string(out)
}
