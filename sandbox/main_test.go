package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/cgroups/v3"

	"github.com/sbx-dev/sbx/internal/poll"
)

func TestMain(m *testing.M) {
	MaybeInit()
	if cfg := os.Getenv(runnerEnv); cfg != "" {
		fakeRunner(cfg)
	}
	os.Exit(m.Run())
}

// runnerEnv makes the test binary a runner that starts one job and then waits to be killed, for
// TestJobDiesWithRunner. Its value is "version mountpoint root warm credential" (warm: Config.Warm;
// credential: Credential.String).
const runnerEnv = "SBX_TEST_FAKE_RUNNER"

// fakeRunner starts "sleep 1000" as job "orphan", prints its pid and sleeps; it never returns.
func fakeRunner(cfg string) {
	f := strings.Split(cfg, " ")
	warm, err := strconv.Atoi(f[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cred, err := parseCredential(f[4])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	m, err := NewManager(Config{Version: f[0], Mountpoint: f[1], Root: f[2], Warm: warm})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if m.warm != nil && !poll.Within(10*time.Second, func() bool { return len(m.warm.ready) == cap(m.warm.ready) }) {
		fmt.Fprintf(os.Stderr, "warm pool holds %d of %d after 10s\n", len(m.warm.ready), cap(m.warm.ready))
		os.Exit(1)
	}
	spec := sh("orphan", "sleep 1000")
	spec.Credential = cred
	p, err := m.Start(spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(p.Pid())
	for {
		time.Sleep(time.Hour) // until the test kills this process
	}
}

// testConfigs lists the cgroup setups this machine offers: v1 where v1 controllers are mounted (legacy
// or hybrid), v2 on the hybrid /sys/fs/cgroup/unified mount or the unified /sys/fs/cgroup.
func testConfigs(t testing.TB) []Config {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	switch cgroups.Mode() {
	case cgroups.Legacy:
		return []Config{{Version: "v1"}}
	case cgroups.Hybrid:
		return []Config{{Version: "v1"}, {Version: "v2", Mountpoint: "/sys/fs/cgroup/unified"}}
	case cgroups.Unified:
		return []Config{{Version: "v2", Mountpoint: "/sys/fs/cgroup"}}
	}
	t.Skip("no cgroup hierarchy mounted at /sys/fs/cgroup")
	return nil
}

// eachVersion runs f as a subtest for every setup from testConfigs.
func eachVersion(t *testing.T, f func(t *testing.T, cfg Config)) {
	for _, cfg := range testConfigs(t) {
		t.Run(cfg.Version, func(t *testing.T) { f(t, cfg) })
	}
}

// newTestManager makes a Manager under a fresh root, unless cfg names one, and removes whatever is left
// under it when the test ends.
func newTestManager(t testing.TB, cfg Config) (*Manager, Config) {
	t.Helper()
	if cfg.Root == "" {
		b := make([]byte, 6)
		rand.Read(b)
		cfg.Root = "sbx-test-" + hex.EncodeToString(b)
	}
	m, err := NewManager(cfg)
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	t.Cleanup(func() {
		m.Close()
		if _, err := m.Sweep(); err != nil {
			t.Errorf("cleanup sweep: %v", err)
		}
		var dirs []string
		switch h := m.h.(type) {
		case *v1Hierarchy:
			for _, mp := range distinct(h.mounts) {
				dirs = append(dirs, filepath.Join(mp, cfg.Root))
			}
		case *v2Hierarchy:
			dirs = append(dirs, h.dir)
		}
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("cleanup: %v", err)
			}
		}
	})
	return m, cfg
}

// sh is a Spec running script with /bin/sh and a minimal environment.
func sh(id, script string) Spec {
	return Spec{ID: id, Path: "/bin/sh", Args: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}}
}

// drain reads r to EOF in the background; the returned function waits for it, failing the test if EOF
// does not come within a few seconds.
func drain(t testing.TB, r io.Reader) func() string {
	t.Helper()
	type read struct {
		out string
		err error
	}
	ch := make(chan read, 1)
	go func() {
		b, err := io.ReadAll(r)
		ch <- read{string(b), err}
	}()
	return func() string {
		t.Helper()
		select {
		case r := <-ch:
			if r.err != nil {
				t.Errorf("read output: %v", r.err)
			}
			return r.out
		case <-time.After(10 * time.Second):
			t.Fatal("output did not reach EOF")
			return ""
		}
	}
}

// run starts spec, waits for it and returns its result and output.
func run(t *testing.T, m *Manager, spec Spec) (Result, string) {
	t.Helper()
	p, err := m.Start(spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	out := drain(t, p.Output())
	res, err := p.Wait()
	if err != nil {
		t.Errorf("Wait: %v", err)
	}
	return res, out()
}

// groupPids lists the processes in p's cgroup.
func groupPids(t testing.TB, p *Process) []int {
	t.Helper()
	pids, err := p.g.(interface{ pids() ([]int, error) }).pids()
	if err != nil {
		t.Fatalf("list cgroup: %v", err)
	}
	return pids
}

// gone reports whether pid has exited: no longer in /proc, or a zombie nobody reaped yet.
func gone(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || strings.HasPrefix(s[i+1:], " Z")
}

// daemonArg is a unique argument for "sleep" in a job, so that survivors finds that process on the
// host: a job's "echo $!" prints a pid of the job's own pid namespace.
func daemonArg() string {
	return fmt.Sprintf("1000.%09d", time.Now().UnixNano()%1e9)
}

// survivors lists the host pids of live processes whose command line is "sleep arg".
func survivors(t testing.TB, arg string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && string(b) == "sleep\x00"+arg+"\x00" && !gone(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// jobCgroups lists the cgroups under m's root other than its warm init steps'.
func jobCgroups(m *Manager) ([]string, error) {
	all, err := m.h.leftovers()
	var jobs []string
	for _, name := range all {
		if !strings.HasPrefix(name, "warm-") {
			jobs = append(jobs, name)
		}
	}
	return jobs, err
}
