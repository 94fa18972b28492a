package main

import (
	"strings"
	"testing"
)

// TestServeUser: `sbx serve --user nobody` runs jobs as nobody and refuses a job that asks for root.
func TestServeUser(t *testing.T) {
	s := startServe(t, "--user", "nobody")
	out, err := s.sbx(t, "run", "--cwd", "/", "--wait", "10s", "--", "id -un; echo $HOME")
	if err != nil || out != "nobody\n/nonexistent\n" {
		t.Fatalf("run: %q, %v; want nobody", out, err)
	}
	out, err = s.sbx(t, "run", "--cwd", "/", "--user", "root", "--wait", "10s", "--", "id -un")
	if err == nil || strings.Contains(out, "root") {
		t.Fatalf("a job asking for root ran: %q, %v", out, err)
	}
	if !strings.Contains(err.Error(), "user root is not allowed") {
		t.Errorf("refusal says %v, want it to name the user", err)
	}
}

// TestServeSudoUser: sbx serve started by root through sudo runs jobs as the user who ran sudo.
func TestServeSudoUser(t *testing.T) {
	t.Setenv("SUDO_USER", "nobody")
	s := startServe(t)
	out, err := s.sbx(t, "run", "--cwd", "/", "--readonly", "--wait", "10s", "--", "id -un")
	if err != nil || out != "nobody\n" {
		t.Fatalf("run: %q, %v; want nobody", out, err)
	}
}
