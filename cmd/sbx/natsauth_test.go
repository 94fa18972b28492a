package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/coordinator/natsauth"
	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/internal/poll"
)

// startRunner runs `sbx runner` in-process with args until the test ends.
func startRunner(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, append([]string{"runner"}, args...), os.Getenv, io.Discard, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("runner: %v", err)
		}
	})
}

// runJob runs command on pool through c and returns its output once it succeeded.
func runJob(t *testing.T, c *client.Client, pool, command string) string {
	t.Helper()
	r, err := c.Start(t.Context(), client.StartRequest{Command: command, Cwd: "/", Pool: pool, BlockUntil: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if r.Backgrounded || r.Job.ExitCode == nil || *r.Job.ExitCode != 0 {
		t.Fatalf("job on pool %s did not succeed: %+v", pool, r)
	}
	return r.Output
}

// TestServeNATSAuth: sbx serve's embedded NATS refuses anonymous clients; a runner joins it with
// creds from `sbx auth runner --data`, and a job runs on it end to end.
func TestServeNATSAuth(t *testing.T) {
	s := startServe(t)
	if !strings.HasPrefix(s.nats, "nats://") {
		t.Fatalf("no NATS URL in serve's ready line: %q", s.nats)
	}
	if nc, err := nats.Connect(s.nats); err == nil {
		nc.Close()
		t.Fatal("an anonymous client connected to sbx serve's NATS")
	} else if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("anonymous connect: %v, want an authorization error", err)
	}
	for _, f := range []string{natsauth.AccountSeedFile, natsauth.OperatorSeedFile} {
		fi, err := os.Stat(filepath.Join(s.data, serveAuthDir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, %v; want mode 0600", f, fi, err)
		}
	}

	creds := filepath.Join(t.TempDir(), "extra.creds")
	if _, err := s.sbx(t, "auth", "runner", "--data", s.data, "--id", "extra", "--pool", "extra", "--out", creds); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(creds); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("runner creds: %v, %v; want mode 0600", fi, err)
	}
	if _, err := s.sbx(t, "runner", "--nats", s.nats, "--nats-creds", creds, "--id", "other"); code(err) != 2 {
		t.Fatalf("a runner with another runner's creds: %v, want a usage error", err)
	}
	if _, err := s.sbx(t, "runner", "--nats", s.nats, "--nats-creds", creds, "--pool", "default"); code(err) != 2 ||
		!strings.Contains(err.Error(), "for pool extra") {
		t.Fatalf("a runner of pool default with pool extra's creds: %v, want a usage error", err)
	}
	// No --id: the runner takes the one its creds were minted for.
	startRunner(t, "--nats", s.nats, "--nats-creds", creds, "--pool", "extra", "--cgroup-root", testCgroupRoot("sbx-cmd-test-extra"))
	if out := runJob(t, s.c, "extra", "echo joined"); out != "joined\n" {
		t.Fatalf("output %q", out)
	}
	rs, err := s.c.Runners(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rs {
		ids = append(ids, r.ID)
	}
	if strings.Join(ids, ",") != "extra,serve" {
		t.Fatalf("runners %v, want extra and serve", ids)
	}
}

// TestFleetNATSAuth: the commands of README's "Auth for several machines", in order: sbx auth init
// makes what an external NATS server includes; a coordinator and a runner with their creds run a
// job end to end; without creds nothing connects.
func TestFleetNATSAuth(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runners need root for cgroups")
	}
	dir := filepath.Join(t.TempDir(), "auth")
	if _, err := cli(t, nil, "auth", "init", "--dir", dir); err != nil {
		t.Fatal(err)
	}
	runnerCreds := filepath.Join(t.TempDir(), "r1.creds")
	if _, err := cli(t, nil, "auth", "runner", "--dir", dir, "--id", "r1", "--out", runnerCreds); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "nats.conf")
	main := "listen: 127.0.0.1:-1\njetstream { store_dir: " + filepath.Join(t.TempDir(), "js") + " }\ninclude " + natsauth.ServerConfigFile + "\n"
	if err := os.WriteFile(conf, []byte(main), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	ns := natstest.Run(t, opts)
	if _, err := cli(t, nil, "coordinator", "--nats", ns.ClientURL(), "--listen", "127.0.0.1:0", "--data", t.TempDir()); err == nil ||
		!strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("a coordinator without creds: %v, want an authorization error", err)
	}

	secret := func(name, value string) string {
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	token, enrollKey := secret("token", "api-token-api-token"), secret("enroll", "enroll-key-enroll-key")

	ctx, cancel := context.WithCancel(context.Background())
	out := &lineWriter{first: make(chan string, 1)}
	ended := make(chan error, 1)
	go func() {
		ended <- run(ctx, []string{"coordinator", "--nats", ns.ClientURL(), "--nats-creds", filepath.Join(dir, natsauth.CoordinatorCredsFile),
			"--listen", "127.0.0.1:0", "--data", t.TempDir(), "--token-file", token,
			"--enroll-key", enrollKey, "--nats-account-key", filepath.Join(dir, natsauth.AccountSeedFile),
			"--enroll-creds-ttl", "3s"}, os.Getenv, out, io.Discard)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-ended; err != nil {
			t.Errorf("coordinator: %v", err)
		}
	})
	var addr string
	select {
	case line := <-out.first:
		_, rest, _ := strings.Cut(line, "API ")
		addr, _, _ = strings.Cut(rest, ",")
	case err := <-ended:
		t.Fatalf("coordinator exited: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("coordinator did not start")
	}
	startRunner(t, "--nats", ns.ClientURL(), "--nats-creds", runnerCreds, "--cgroup-root", testCgroupRoot("sbx-cmd-test-fleet"))
	c := client.New(addr, "api-token-api-token")
	poll.Until(t, 20*time.Second, "runner r1 joins", func() bool {
		rs, err := c.Runners(t.Context())
		return err == nil && len(rs) == 1 && rs[0].ID == "r1"
	})
	if out := runJob(t, c, "", "echo fleet"); out != "fleet\n" {
		t.Fatalf("output %q", out)
	}

	// A runner of unknown id enrolls with the enroll key (not the API token) and runs work.
	wrongKey := secret("wrong", "not-the-enroll-key")
	if _, err := cli(t, nil, "runner", "--nats", ns.ClientURL(), "--enroll", addr, "--enroll-key-file", wrongKey, "--id", "r2"); err == nil ||
		!strings.Contains(err.Error(), "enroll key") {
		t.Fatalf("a runner with a wrong enroll key: %v, want refused", err)
	}
	enrolled := time.Now()
	startRunner(t, "--nats", ns.ClientURL(), "--enroll", addr, "--enroll-key-file", enrollKey, "--id", "r2", "--pool", "enrolled",
		"--cgroup-root", testCgroupRoot("sbx-cmd-test-enrolled"))
	if out := runJob(t, c, "enrolled", "echo enrolled"); out != "enrolled\n" {
		t.Fatalf("output %q", out)
	}
	// Its creds live 3 s; it renews them through the enroll route and keeps working past that.
	time.Sleep(time.Until(enrolled.Add(5 * time.Second))) // past the creds' 3 s
	if out := runJob(t, c, "enrolled", "echo renewed"); out != "renewed\n" {
		t.Fatalf("output %q", out)
	}
}

// TestServeNATSTLS: sbx serve's embedded NATS serves TLS (its own runner still works in-process); a
// runner joins with --nats-ca, and one without the CA is refused.
func TestServeNATSTLS(t *testing.T) {
	cert, key := selfSigned(t, t.TempDir())
	s := startServe(t, "--nats-tls-cert", cert, "--nats-tls-key", key)
	if out := runJob(t, s.c, "", "echo local"); out != "local\n" {
		t.Fatalf("output %q", out)
	}
	creds := filepath.Join(t.TempDir(), "tls.creds")
	if _, err := s.sbx(t, "auth", "runner", "--data", s.data, "--id", "tls", "--out", creds); err != nil {
		t.Fatal(err)
	}
	if _, err := s.sbx(t, "runner", "--nats", s.nats, "--nats-creds", creds, "--pool", "tls"); err == nil ||
		!strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a runner without the CA: %v, want a certificate error", err)
	}
	startRunner(t, "--nats", s.nats, "--nats-creds", creds, "--nats-ca", cert, "--pool", "tls", "--cgroup-root", testCgroupRoot("sbx-cmd-test-tls"))
	if out := runJob(t, s.c, "tls", "echo over tls"); out != "over tls\n" {
		t.Fatalf("output %q", out)
	}
}

// TestAuthRevokeAndRotate: the commands of "Expiry, revocation and rotation" in docs/security.md:
// runner creds carry --expires, `sbx auth coordinator` mints creds of a new user, and `sbx auth
// revoke` puts a runner's or a creds file's user on the account's list in nats-auth.conf.
func TestAuthRevokeAndRotate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "auth")
	if _, err := cli(t, nil, "auth", "init", "--dir", dir); err != nil {
		t.Fatal(err)
	}
	r1 := filepath.Join(t.TempDir(), "r1.creds")
	if _, err := cli(t, nil, "auth", "runner", "--dir", dir, "--id", "r1", "--expires", "1h", "--out", r1); err != nil {
		t.Fatal(err)
	}
	b, err := natsauth.ReadSecret(r1)
	if err != nil {
		t.Fatal(err)
	}
	if issued, expires, err := natsauth.Lifetime(b); err != nil || expires.Sub(issued) != time.Hour {
		t.Fatalf("creds issued %v expire %v (%v), want an hour later", issued, expires, err)
	}
	oldCoord := filepath.Join(t.TempDir(), "old.creds")
	if b, err := natsauth.ReadSecret(filepath.Join(dir, natsauth.CoordinatorCredsFile)); err != nil {
		t.Fatal(err)
	} else if err := natsauth.WriteSecret(oldCoord, b); err != nil {
		t.Fatal(err)
	}
	if _, err := cli(t, nil, "auth", "coordinator", "--dir", dir); err != nil {
		t.Fatal(err)
	}
	userOf := func(path string) string {
		t.Helper()
		b, err := natsauth.ReadSecret(path)
		if err != nil {
			t.Fatal(err)
		}
		pub, err := natsauth.UserOf(b)
		if err != nil {
			t.Fatal(err)
		}
		return pub
	}
	if userOf(oldCoord) == userOf(filepath.Join(dir, natsauth.CoordinatorCredsFile)) {
		t.Fatal("the rotated coordinator creds have the old user")
	}
	for _, args := range [][]string{{"--id", "r1"}, {"--creds", oldCoord}} {
		if _, err := cli(t, nil, append([]string{"auth", "revoke", "--dir", dir}, args...)...); err != nil {
			t.Fatal(err)
		}
	}
	conf, err := os.ReadFile(filepath.Join(dir, natsauth.ServerConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{}
	if err := opts.ProcessConfigString(string(conf)); err != nil {
		t.Fatal(err)
	}
	_, accJWT, _ := strings.Cut(string(conf), "resolver_preload: {\n  ")
	_, accJWT, _ = strings.Cut(accJWT, ": ")
	accJWT, _, _ = strings.Cut(accJWT, "\n")
	acc, err := jwt.DecodeAccountClaims(accJWT)
	if err != nil {
		t.Fatal(err)
	}
	for name, pub := range map[string]string{"r1": userOf(r1), "old coordinator": userOf(oldCoord)} {
		if _, ok := acc.Revocations[pub]; !ok {
			t.Errorf("%s (%s) is not on the account's revocation list %v", name, pub, acc.Revocations)
		}
	}
	if _, err := cli(t, nil, "auth", "revoke", "--dir", dir); exitCode(err, io.Discard) != 2 {
		t.Fatalf("revoke with neither --id nor --creds: %v, want exit 2", err)
	}
}
