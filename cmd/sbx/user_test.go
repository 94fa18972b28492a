package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/runner"
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

// ensureJobUser creates runner.JobUser, as `make deps` does, on a machine that lacks it: sbx serve
// run by root runs the jobs whose cwd root owns as that user. Test binaries of several packages may
// race to create it; the loser finds it made.
func ensureJobUser() error {
	if os.Geteuid() != 0 {
		return nil // the tests that run jobs need root and skip
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := user.Lookup(runner.JobUser); err == nil {
			return nil
		}
		out, err := exec.Command("useradd", "--system", "--create-home", "--home-dir", "/var/lib/"+runner.JobUser,
			"--shell", "/usr/sbin/nologin", runner.JobUser).CombinedOutput()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("create user %s: %v: %s", runner.JobUser, err, out)
		}
		time.Sleep(100 * time.Millisecond) // between attempts, while another package's test holds the lock
	}
}

// TestServeJobsNotRoot: the reproduction. sbx serve started by root with no SUDO_USER and
// no --user, as the systemd unit starts it, runs a plain or readonly job in a cwd of root's as
// runner.JobUser, not root: the job cannot read the NATS account key in the data dir, nor the TLS
// keys serve was given, though the way to each is open (their modes and the job's user keep it out).
func TestServeJobsNotRoot(t *testing.T) {
	t.Setenv("SUDO_USER", "")
	cert, key := selfSigned(t, openDir(t))
	natsCert, natsKey := selfSigned(t, openDir(t))
	s := startServe(t, "--tls-cert", cert, "--tls-key", key, "--nats-tls-cert", natsCert, "--nats-tls-key", natsKey)
	openWay(t, s.data)
	account := filepath.Join(s.data, "nats-auth", "account.nk")
	secrets := []string{account, key, natsKey}
	u, err := user.Lookup(runner.JobUser)
	if err != nil {
		t.Fatal(err)
	}
	for _, readonly := range []bool{false, true} {
		command := "id -u; cat " + strings.Join(secrets, " ") + " 2>/dev/null; echo end"
		r, err := s.c.Start(t.Context(), client.StartRequest{Cwd: "/", Readonly: readonly, Command: command})
		if err != nil {
			t.Fatal(err)
		}
		_, out := waitJob(t, s, r.Job.ID)
		if out != u.Uid+"\nend\n" {
			t.Errorf("readonly %v: output %q, want uid %s and no secret", readonly, out, u.Uid)
		}
	}
}

// TestServeHidesSecretPaths: a readonly job does not see the TLS keys serve was given even when it
// runs as root (--allow-root-jobs), which file modes do not stop: they are hidden as the data dir is.
func TestServeHidesSecretPaths(t *testing.T) {
	cert, key := selfSigned(t, openDir(t))
	natsCert, natsKey := selfSigned(t, openDir(t))
	s := startServe(t, "--allow-root-jobs", "--tls-cert", cert, "--tls-key", key, "--nats-tls-cert", natsCert, "--nats-tls-key", natsKey)
	j, out := runReadonly(t, s, "id -u; cat "+key+" "+natsKey+" "+filepath.Join(s.data, "nats-auth", "account.nk")+" 2>/dev/null; echo end", nil)
	if out != "0\nend\n" {
		t.Errorf("a readonly root job: %q (%s), want uid 0 and no secret", out, j.Status)
	}
}

// TestServeRefusesOpenSecrets: serve refuses a secret that a job's user could read: a key others may
// read, one another user owns.
func TestServeRefusesOpenSecrets(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a file away")
	}
	for _, tt := range []struct {
		name      string
		mode      os.FileMode
		uid       int
		complaint string
	}{
		{"readable by others", 0o644, 0, "chmod 600"},
		{"owned by nobody", 0o600, 65534, "belongs to uid 65534"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cert, key := selfSigned(t, t.TempDir())
			if err := os.Chmod(key, tt.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(key, tt.uid, -1); err != nil {
				t.Fatal(err)
			}
			err := run(t.Context(), []string{"serve", "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:-1", "--data", t.TempDir(),
				"--tls-cert", cert, "--tls-key", key}, os.Getenv, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), tt.complaint) {
				t.Errorf("serve with a %s key: %v, want a refusal naming it and %q", tt.name, err, tt.complaint)
			}
		})
	}
}

// TestSecretFlags: every flag of serve and runner that names a key, creds or a token is one whose
// path is hidden from jobs and checked (secretFlags).
func TestSecretFlags(t *testing.T) {
	for _, cmd := range []string{"serve", "runner"} {
		var help bytes.Buffer
		if err := run(t.Context(), []string{cmd, "-h"}, os.Getenv, io.Discard, &help); code(err) != 0 {
			t.Fatalf("%s -h: %v", cmd, err)
		}
		seen := 0
		for _, line := range strings.Split(help.String(), "\n") {
			// "  -NAME TYPE" for a flag that takes a value, "  -NAME" for a bool. A secret is a path,
			// so a string flag (--mcp-max-sessions-per-token is a number).
			name, typ, ok := strings.Cut(strings.TrimPrefix(line, "  -"), " ")
			if !strings.HasPrefix(line, "  -") || !ok {
				continue
			}
			secret := typ == "string" && regexp.MustCompile(`key|cred|token|secret|password`).MatchString(name)
			if secret && !slices.Contains(secretFlags, name) {
				t.Errorf("sbx %s --%s names a secret, but jobs are not kept from it (secretFlags)", cmd, name)
			}
			if slices.Contains(secretFlags, name) {
				seen++
			}
		}
		if seen == 0 {
			t.Errorf("sbx %s -h shows no secret flag: %s", cmd, help.String())
		}
	}
}

// jobDir returns a new directory that runner.JobUser owns, with the way to it open: a job a root
// runner without --user runs there runs as that user, and may write in it.
func jobDir(t *testing.T) string {
	t.Helper()
	u, err := user.Lookup(runner.JobUser)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	dir := filepath.Join(t.TempDir(), "job")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	openWay(t, dir)
	return dir
}

// openDir returns a new directory anyone can search, so that only a file's own mode keeps others out.
func openDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	openWay(t, filepath.Join(dir, "x"))
	return dir
}

// openWay lets anyone search every directory above path (t.TempDir's are 0700).
func openWay(t *testing.T, path string) {
	t.Helper()
	for d := filepath.Dir(path); d != "/"; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
				t.Fatal(err)
			}
		}
	}
}
