package runner

import (
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/proto"
)

// TestShell: jobs run in bash by default where it is installed (agents write bash), in sh when they
// ask, readonly jobs too.
func TestShell(t *testing.T) {
	requireBwrap(t)
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	h := newHarness(t)
	id := "shell"
	h.startRunner(Config{ID: id, Slots: 2})
	probe := `echo "${BASH_VERSION:+bash}${BASH_VERSION:-sh}" | cut -c1-4; [[ 1 == 1 ]] 2>/dev/null && echo brackets`
	for i, tt := range []struct {
		shell    string
		readonly bool
		output   string
	}{
		{"", false, "bash\nbrackets\n"},
		{"", true, "bash\nbrackets\n"},
		{proto.ShellBash, false, "bash\nbrackets\n"},
		{proto.ShellSh, false, "sh\n"},
		{proto.ShellSh, true, "sh\n"},
	} {
		t.Run(fmt.Sprintf("%q readonly=%v", tt.shell, tt.readonly), func(t *testing.T) {
			subject := proto.WorkSubject("default", proto.CapPlain)
			if tt.readonly {
				subject = proto.WorkSubject("default", proto.CapReadonly)
			}
			jobID := h.submitWork(subject, &proto.Work{JobID: fmt.Sprintf("%s-%d", id, i), Command: probe, Shell: tt.shell, Readonly: tt.readonly})
			e := h.exited(jobID, 20*time.Second)
			if e.Reason != proto.ReasonExit {
				t.Fatalf("exited %+v", e)
			}
			if got := h.out(jobID); got != tt.output {
				t.Errorf("output %q, want %q", got, tt.output)
			}
		})
	}
}
