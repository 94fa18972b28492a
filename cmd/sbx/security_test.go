package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
)

// coordinatorRun is an `sbx coordinator` run in-process against a NATS server of the test's own.
type coordinatorRun struct {
	url    string // the API's, from the ready line
	nats   string
	data   string
	cancel context.CancelFunc
	ended  chan struct{} // closed when run returned, with err
	err    error
}

// startCoordinator runs `sbx coordinator` with extra flags and waits for its ready line. It needs
// no root: no runner is started.
func startCoordinator(t *testing.T, data string, extra ...string) *coordinatorRun {
	t.Helper()
	ns := natstest.Server(t)
	ctx, cancel := context.WithCancel(context.Background())
	out := &lineWriter{first: make(chan string, 1)}
	args := append([]string{"coordinator", "--nats", ns.ClientURL(), "--listen", "127.0.0.1:0", "--data", data}, extra...)
	c := &coordinatorRun{nats: ns.ClientURL(), data: data, cancel: cancel, ended: make(chan struct{})}
	go func() { c.err = run(ctx, args, os.Getenv, out, io.Discard); close(c.ended) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-c.ended:
		case <-time.After(20 * time.Second):
			t.Error("coordinator did not stop")
		}
	})
	select {
	case line := <-out.first:
		// "sbx dev: API http://127.0.0.1:PORT, data ..."
		_, rest, _ := strings.Cut(line, "API ")
		c.url, _, _ = strings.Cut(rest, ",")
	case <-c.ended:
		t.Fatalf("coordinator exited: %v", c.err)
	case <-time.After(30 * time.Second):
		t.Fatal("coordinator did not start")
	}
	return c
}

// cli runs a client command with the given environment and returns its stdout and error.
func cli(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	var stdout strings.Builder
	err := run(t.Context(), args, func(k string) string { return env[k] }, &stdout, io.Discard)
	return stdout.String(), err
}

// TestListenNeedsToken: without a token the API listens on loopback only, and a token file that
// others may read is refused.
func TestListenNeedsToken(t *testing.T) {
	dir := t.TempDir()
	token := func(name string, mode os.FileMode) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte("s3cret-s3cret-s3cret\n"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return path
	}
	private, worldReadable, groupReadable := token("private", 0o600), token("world", 0o644), token("group", 0o640)
	// NATS is never reached by the refused runs; the others pass the checks and then wait for it
	// (want ""), which they say, until the test stops them.
	const noNATS = "nats://127.0.0.1:1"
	tests := []struct {
		name string
		args []string
		want string // in the error
		code int
	}{
		{"coordinator on every address", []string{"coordinator", "--nats", noNATS, "--listen", "0.0.0.0:0"}, "without a token", 2},
		{"coordinator on all of IPv6", []string{"coordinator", "--nats", noNATS, "--listen", "[::]:0"}, "without a token", 2},
		{"serve on every address", []string{"serve", "--listen", ":0", "--nats-listen", "127.0.0.1:-1"}, "without a token", 2},
		{"world-readable token", []string{"coordinator", "--nats", noNATS, "--token-file", worldReadable}, worldReadable + " has mode 0644", 1},
		{"group-readable token", []string{"serve", "--token-file", groupReadable, "--nats-listen", "127.0.0.1:-1"}, groupReadable + " has mode 0640", 1},
		{"any host without a token", []string{"coordinator", "--nats", noNATS, "--allow-host", "*"}, "needs --token-file", 2},
		{"cert without key", []string{"coordinator", "--nats", noNATS, "--tls-cert", private}, "--tls-key", 2},
		{"with a token", []string{"coordinator", "--nats", noNATS, "--listen", "0.0.0.0:0", "--token-file", private}, "", 0},
		{"explicit override", []string{"coordinator", "--nats", noNATS, "--listen", "0.0.0.0:0", "--insecure-no-token"}, "", 0},
		{"loopback", []string{"coordinator", "--nats", noNATS, "--listen", "127.0.0.1:0"}, "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append(tt.args, "--data", t.TempDir())
			timeout := 30 * time.Second
			if tt.want == "" {
				timeout = 2 * time.Second
			}
			ctx, cancel := context.WithTimeout(t.Context(), timeout)
			defer cancel()
			var stderr bytes.Buffer // read after run returned: nothing writes to it then
			err := run(ctx, args, os.Getenv, io.Discard, &stderr)
			if tt.want == "" {
				if err != nil || !strings.Contains(stderr.String(), "waiting for NATS") {
					t.Errorf("run %v: %v, want it to pass the checks and wait for NATS; stderr:\n%s", tt.args, err, stderr.String())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || code(err) != tt.code {
				t.Errorf("run %v: %v (exit %d), want exit %d and %q", tt.args, err, code(err), tt.code, tt.want)
			}
		})
	}
}

// TestCoordinatorStopsWithItsConsumer: when the event consumer goes away under a running
// coordinator (`nats consumer rm SBX_EVENTS coordinator`), the coordinator exits with an error,
// so that systemd or compose restarts it, instead of closing its API and hanging.
func TestCoordinatorStopsWithItsConsumer(t *testing.T) {
	c := startCoordinator(t, t.TempDir())
	nc, err := nats.Connect(c.nats)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// As under a coordinator that has been running: its consumer exists and its pull is waiting.
	if !poll.Within(20*time.Second, func() bool {
		var cons jetstream.Consumer
		if cons, err = js.Consumer(t.Context(), proto.EventStream, proto.EventConsumer); err != nil {
			return false
		}
		info, err := cons.Info(t.Context())
		return err == nil && info.NumWaiting > 0
	}) {
		t.Fatalf("the coordinator's consumer is not pulling: %v", err)
	}
	if err := js.DeleteConsumer(t.Context(), proto.EventStream, proto.EventConsumer); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.ended:
		if c.err == nil || !strings.Contains(c.err.Error(), "event consumer") || code(c.err) == 0 {
			t.Errorf("coordinator ended with %v (exit %d), want an error naming the event consumer", c.err, code(c.err))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("coordinator still running 30 s after its consumer was deleted")
	}
}

// TestCoordinatorStops: a coordinator asked to stop exits cleanly (exit 0).
func TestCoordinatorStops(t *testing.T) {
	c := startCoordinator(t, t.TempDir())
	c.cancel()
	select {
	case <-c.ended:
		if c.err != nil {
			t.Errorf("coordinator stopped with %v, want nil", c.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("coordinator did not stop")
	}
}

// TestDataDirModes: the data dir is 0700, an older one's 0755 tightened.
func TestDataDirModes(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(data, 0o755); err != nil {
		t.Fatal(err)
	}
	startCoordinator(t, data)
	for path, want := range map[string]os.FileMode{data: 0o700, filepath.Join(data, "terminals"): 0o700, filepath.Join(data, "sbx.db"): 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s has mode %04o, want %04o", path, got, want)
		}
	}
}

// TestClientIDsStayInTheirSegment: `sbx status ../../healthz` once reached /healthz and printed it
// as a job. Every id is now one path segment, and the server refuses ids that are not tokens.
func TestClientIDsStayInTheirSegment(t *testing.T) {
	c := startCoordinator(t, t.TempDir())
	env := map[string]string{"SBX_ADDR": c.url}
	for _, args := range [][]string{
		{"status", "../../healthz"},
		{"status", ".."},
		{"kill", "../../v1/sessions/default"},
		{"logs", "."},
		{"wait", "--timeout", "1s", "../jobs"},
		{"end-session", ".."},
	} {
		out, err := cli(t, env, args...)
		if err == nil || !strings.Contains(err.Error(), " id ") || strings.Contains(out, "status: ") {
			t.Errorf("sbx %v: %q, %v; want a refusal naming the id", args, out, err)
		}
	}
}

// TestBrowserRefused: the reproduction against a real coordinator: a page's text/plain
// POST, cross-origin, and the same through DNS rebinding.
func TestBrowserRefused(t *testing.T) {
	c := startCoordinator(t, t.TempDir())
	body := `{"command":"touch /tmp/sbx-pwned","cwd":"/"}`
	for _, h := range []map[string]string{
		{"Content-Type": "text/plain", "Origin": "http://evil.example"},
		{"Content-Type": "text/plain"},
		{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"},
		{"Content-Type": "application/json", "Host": "evil.example"},
	} {
		req, err := http.NewRequestWithContext(t.Context(), "POST", c.url+"/v1/jobs", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range h {
			req.Header.Set(k, v)
		}
		req.Host = h["Host"]
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusUnsupportedMediaType {
			t.Errorf("%v: status %d, want 403 or 415", h, resp.StatusCode)
		}
	}
}

// TestTLS: --tls-cert/--tls-key serve the API over HTTPS; the CLI trusts a self-signed certificate
// given in SBX_CA_FILE, and only then.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	c := startCoordinator(t, t.TempDir(), "--tls-cert", cert, "--tls-key", key)
	if !strings.HasPrefix(c.url, "https://") {
		t.Fatalf("ready line's API %q, want https://", c.url)
	}
	out, err := cli(t, map[string]string{"SBX_ADDR": c.url, "SBX_CA_FILE": cert}, "runners")
	if err != nil || !strings.HasPrefix(out, "ID") {
		t.Errorf("runners over https with the CA: %q, %v", out, err)
	}
	if _, err := cli(t, map[string]string{"SBX_ADDR": c.url}, "ps"); err == nil || !strings.Contains(err.Error(), "SBX_CA_FILE") {
		t.Errorf("ps without the CA: %v, want a hint at SBX_CA_FILE", err)
	}
	if _, err := cli(t, map[string]string{"SBX_ADDR": strings.Replace(c.url, "https:", "http:", 1)}, "ps"); err == nil {
		t.Error("plain http to the https API succeeded")
	}
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and localhost and its key (0600) to
// dir and returns their paths.
func selfSigned(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sbx test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}
