package sandbox

import (
	"os"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sbx-dev/sbx/internal/poll"
)

// waitWarm waits until m's warm pool is full.
func waitWarm(t testing.TB, m *Manager) {
	t.Helper()
	if !poll.Within(10*time.Second, func() bool { return len(m.warm.ready) == cap(m.warm.ready) }) {
		t.Fatalf("warm pool holds %d of %d after 10s", len(m.warm.ready), cap(m.warm.ready))
	}
}

// newWarmManager makes a v1 Manager with a full warm pool, or skips where there can be none.
func newWarmManager(t *testing.T) (*Manager, Config) {
	t.Helper()
	if !warmInit {
		t.Skip("warm init steps need the cgo build")
	}
	cfg := testConfigs(t)[0]
	if cfg.Version != "v1" {
		t.Skip("warm init steps are for cgroup v1")
	}
	m, cfg := newTestManager(t, cfg)
	waitWarm(t, m)
	return m, cfg
}

// TestWarmStart: a job started from a warm init step runs in a cgroup named for it, with its limits,
// directory, environment and arguments, exactly as a cold start.
func TestWarmStart(t *testing.T) {
	m, cfg := newWarmManager(t)
	limit := int64(64 << 20)
	spec := Spec{
		ID: "warm-job", Path: "/bin/sh", Dir: "/tmp", Env: []string{"ONLY=this"},
		Args:      []string{"sh", "-c", `echo "$0 $1"; pwd; env | grep -v '^PWD='; grep -E ':(memory|pids):' /proc/self/cgroup; cat /sys/fs/cgroup/memory/` + cfg.Root + `/warm-job/memory.limit_in_bytes`, "a b", "c"},
		Resources: &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}},
	}
	t0 := time.Now()
	p, err := m.Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	startTook := time.Since(t0)
	out := drain(t, p.Output())
	res, err := p.Wait()
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("Wait = %+v, %v", res, err)
	}
	want := []string{"a b c", "/tmp", "ONLY=this", ":memory:/" + cfg.Root + "/warm-job", ":pids:/" + cfg.Root + "/warm-job", "67108864"}
	got := out()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("output lacks %q:\n%s", w, got)
		}
	}
	t.Logf("warm start took %v", startTook)
	if n := len(m.warm.ready); n != cap(m.warm.ready)-1 {
		t.Errorf("%d warm init steps ready after a start; want %d: the start took one and the pool refills only at half", n, cap(m.warm.ready)-1)
	}

	// A job whose directory is missing fails to start, and the next one starts.
	if _, err := m.Start(Spec{ID: "nodir", Path: "/bin/true", Dir: "/does/not/exist"}); err == nil || !strings.Contains(err.Error(), "/does/not/exist") {
		t.Errorf("Start with a missing dir = %v", err)
	}
	if res, out := run(t, m, sh("after", "echo fine")); res.ExitCode != 0 || out != "fine\n" {
		t.Errorf("after a failed start: %+v %q", res, out)
	}
	if left, err := jobCgroups(m); err != nil || len(left) != 0 {
		t.Errorf("job cgroups left: %v, %v", left, err)
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory/" + cfg.Root + "/nodir"); err == nil {
		t.Error("the failed start left its cgroup")
	}
}

// TestWarmClose: Close ends the warm init steps and removes their cgroups.
func TestWarmClose(t *testing.T) {
	m, _ := newWarmManager(t)
	if res, out := run(t, m, sh("one", "echo one")); res.ExitCode != 0 || out != "one\n" {
		t.Fatalf("job: %+v %q", res, out)
	}
	m.Close()
	if left, err := m.h.leftovers(); err != nil || len(left) != 0 {
		t.Fatalf("after Close: %v, %v", left, err)
	}
}
