package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbx-dev/sbx/coordinator/client"
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
	dir := t.TempDir()
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
