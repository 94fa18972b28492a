package runner

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/proto"
)

// TestJobUser: a runner with a default user runs plain and readonly jobs as that user, with its HOME,
// USER and LOGNAME; a job may name another user only when the runner allows it; root is refused.
func TestJobUser(t *testing.T) {
	requireBwrap(t)
	h := newHarness(t)
	id := "user"
	hbs := h.heartbeats(id)
	h.startRunner(Config{ID: id, Slots: 2, User: "nobody", Users: []string{"daemon"}})
	if hb := firstHeartbeat(t, hbs); !hb.Readonly {
		t.Fatalf("readonly probe as nobody failed: %s", hb.ReadonlyReason)
	}
	show := `echo "$(id -un) $(id -u) $HOME $USER $LOGNAME"`
	tests := []struct {
		name     string
		user     string
		readonly bool
		env      map[string]string
		output   string // "" with failed: start_failed naming the user
		failed   string
	}{
		{name: "default", output: "nobody 65534 /nonexistent nobody nobody\n"},
		{name: "default readonly", readonly: true, output: "nobody 65534 /nonexistent nobody nobody\n"},
		{name: "allowed other", user: "daemon", output: "daemon 1 /usr/sbin daemon daemon\n"},
		{name: "job env wins", env: map[string]string{"HOME": "/tmp"}, output: "nobody 65534 /tmp nobody nobody\n"},
		{name: "root refused", user: "root", failed: "user root is not allowed"},
		{name: "uid 0 refused", user: "0", failed: "user 0 is not allowed"},
		{name: "unknown", user: "sbx-no-such-user", failed: "user sbx-no-such-user is not allowed"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			subject := proto.WorkSubject("default", proto.CapPlain)
			if tt.readonly {
				subject = proto.WorkSubject("default", proto.CapReadonly)
			}
			jobID := h.submitWork(subject, &proto.Work{JobID: fmt.Sprintf("%s-%d", id, i), Command: show, Cwd: "/", User: tt.user, Env: tt.env, Readonly: tt.readonly})
			e := h.exited(jobID, 20*time.Second)
			if tt.failed != "" {
				if e.Reason != proto.ReasonStartFailed || !strings.Contains(e.Error, tt.failed) {
					t.Fatalf("exited %+v, want start_failed with %q", e, tt.failed)
				}
				if out := h.out(jobID); out != "" {
					t.Fatalf("a refused job printed %q", out)
				}
				return
			}
			if e.Reason != proto.ReasonExit || e.ExitCode == nil || *e.ExitCode != 0 {
				t.Fatalf("exited %+v (%s)", e, h.out(jobID))
			}
			if got := h.out(jobID); got != tt.output {
				t.Fatalf("output %q, want %q", got, tt.output)
			}
		})
	}
}

// TestRunnerUserConfig: an unknown default user, or other users without a default, fail at start-up.
func TestRunnerUserConfig(t *testing.T) {
	for _, cfg := range []Config{{ID: "x", User: "sbx-no-such-user"}, {ID: "x", Users: []string{"nobody"}}, {ID: "x", User: "nobody", Users: []string{"sbx-no-such-user"}}} {
		if err := cfg.setDefaults(); err == nil {
			t.Errorf("setDefaults(%+v) accepted it", cfg)
		}
	}
}
