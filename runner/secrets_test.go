package runner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/proto"
)

// TestJobsSeeNoSecrets: a plain job's environment holds no NATS_* variable and none naming the
// runner's credentials; a readonly job cannot read the credentials file, even as root.
func TestJobsSeeNoSecrets(t *testing.T) {
	requireBwrap(t)
	h := newHarness(t)
	dir := t.TempDir()
	creds := filepath.Join(dir, "runner.creds")
	if err := os.WriteFile(creds, []byte("-----BEGIN NATS USER JWT-----\nsecret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hbs := h.heartbeats("secrets")
	// Jobs run as root, so that only the hiding keeps the readonly job out of the file.
	h.startRunner(Config{ID: "secrets", Slots: 2, AllowRoot: true, Secrets: []string{creds}, Environ: []string{
		"PATH=/usr/bin:/bin", "KEEP=kept", "NATS_URL=nats://user:pw@host:4222", "NATS_CREDS=x", "SBX_TOKEN=t",
		"MY_CREDS=" + creds, "CONFIG=--creds=" + creds + " --x",
	}})
	if hb := firstHeartbeat(t, hbs); !hb.Readonly {
		t.Fatalf("readonly probe failed: %s", hb.ReadonlyReason)
	}
	plain := h.submitWork(proto.WorkSubject("default", proto.CapPlain), &proto.Work{JobID: "secrets-plain", Command: "env", Cwd: "/"})
	if e := h.exited(plain, 20*time.Second); e.Reason != proto.ReasonExit {
		t.Fatalf("plain job: %+v", e)
	}
	env := h.out(plain)
	if !strings.Contains(env, "KEEP=kept\n") {
		t.Fatalf("the job lost an ordinary variable: %q", env)
	}
	for _, leak := range []string{"NATS_", "SBX_", creds} {
		if strings.Contains(env, leak) {
			t.Errorf("a plain job's environment holds %q:\n%s", leak, env)
		}
	}
	ro := h.submitWork(proto.WorkSubject("default", proto.CapReadonly), &proto.Work{JobID: "secrets-ro", Command: "cat " + creds + "; echo end", Cwd: "/", Readonly: true})
	if e := h.exited(ro, 20*time.Second); e.Reason != proto.ReasonExit {
		t.Fatalf("readonly job: %+v", e)
	}
	if out := h.out(ro); strings.Contains(out, "secret") || !strings.HasSuffix(out, "end\n") {
		t.Fatalf("a readonly job read the runner's credentials: %q", out)
	}
}
