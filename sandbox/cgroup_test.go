package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sbx-dev/sbx/internal/poll"
)

func TestV1Mounts(t *testing.T) {
	tests := []struct {
		name      string
		mountinfo string
		want      map[string]string
	}{
		{"hybrid, cpu and cpuacct apart", `
24 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
35 24 0:30 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory
36 24 0:31 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
37 24 0:32 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
38 24 0:33 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
39 24 0:34 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`, map[string]string{"memory": "/sys/fs/cgroup/memory", "cpu": "/sys/fs/cgroup/cpu", "cpuacct": "/sys/fs/cgroup/cpuacct"}},
		{"cpu,cpuacct together, freezer bind-mounted twice", `
40 24 0:35 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
41 24 0:36 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
42 24 0:36 / /mnt/freezer rw - cgroup cgroup rw,freezer
43 24 0:37 / /sys/fs/cgroup/pids rw shared:1 master:2 - cgroup cgroup rw,pids
`, map[string]string{"cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
			"freezer": "/sys/fs/cgroup/freezer", "pids": "/sys/fs/cgroup/pids"}},
		{"unified only", "25 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n", map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := v1Mounts(strings.NewReader(tt.mountinfo))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for c, mp := range tt.want {
				if got[c] != mp {
					t.Errorf("%s: got %q, want %q", c, got[c], mp)
				}
			}
		})
	}
}

// TestV1Paths checks that the library finds each controller's job cgroup under its mountpoint,
// including controllers mounted together under a name that is not theirs.
func TestV1Paths(t *testing.T) {
	mounts := map[string]string{
		"memory":  "/sys/fs/cgroup/memory",
		"cpu":     "/sys/fs/cgroup/cpu,cpuacct",
		"cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
		"freezer": "/mnt/cg/freezer",
		"pids":    "/mnt/cg/tasks",
	}
	h := newV1Hierarchy("sbx", "legacy", mounts)
	if len(h.subsystems) != len(mounts) {
		t.Fatalf("%d subsystems for %d mounts", len(h.subsystems), len(mounts))
	}
	for _, s := range h.subsystems {
		rel, err := h.path("sbx/job")(s.Name())
		if err != nil {
			t.Fatal(err)
		}
		got := s.(interface{ Path(string) string }).Path(rel)
		if want := mounts[string(s.Name())] + "/sbx/job"; got != want {
			t.Errorf("%s: %s, want %s", s.Name(), got, want)
		}
	}
}

func TestNewManagerDescribe(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		cfg.Root = "sbx-test-nested-" + strconv.Itoa(os.Getpid()) + "/runner-1"
		var m *Manager
		// Registered first so that it runs last, after newTestManager has removed runner-1.
		t.Cleanup(func() {
			if m == nil {
				return
			}
			parent := filepath.Dir(cfg.Root)
			if h, ok := m.h.(*v1Hierarchy); ok {
				for _, mp := range distinct(h.mounts) {
					os.Remove(filepath.Join(mp, parent))
				}
				return
			}
			os.Remove(filepath.Join(cfg.Mountpoint, parent))
		})
		m, _ = newTestManager(t, cfg)
		if m.Version() != cfg.Version {
			t.Errorf("Version() = %q, want %q", m.Version(), cfg.Version)
		}
		want := "v2 " + filepath.Join(cfg.Mountpoint, cfg.Root)
		if cfg.Version == "v1" {
			want = "/" + cfg.Root
		}
		if d := m.Describe(); !strings.HasPrefix(d, cfg.Version) || !strings.HasSuffix(d, want) {
			t.Errorf("Describe() = %q, want %q", d, want)
		}
		if res, out := run(t, m, sh("nested", "echo ok")); res.ExitCode != 0 || out != "ok\n" {
			t.Errorf("job under nested root: %+v %q", res, out)
		}
	})
}

// startLimited starts spec with r, skipping the test where the hierarchy lacks a needed controller.
func startLimited(t *testing.T, m *Manager, spec Spec, r *specs.LinuxResources) *Process {
	t.Helper()
	spec.Resources = r
	p, err := m.Start(spec)
	if errors.Is(err, ErrNoController) {
		t.Skipf("%s: %v", m.Describe(), err)
	}
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	return p
}

func TestMemoryLimit(t *testing.T) {
	limit := int64(64 << 20)
	tests := []struct {
		name    string
		script  string
		wantOOM bool
	}{
		{"over limit", "head -c 400000000 /dev/zero | tail", true},
		{"under limit", "head -c 4000000 /dev/zero | tail | wc -c", false},
	}
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				p := startLimited(t, m, sh("mem", tt.script), &specs.LinuxResources{Memory: &specs.LinuxMemory{Limit: &limit}})
				out := drain(t, p.Output())
				res, err := p.Wait()
				if err != nil {
					t.Errorf("Wait: %v", err)
				}
				out()
				if res.OOMKilled != tt.wantOOM {
					t.Errorf("OOMKilled = %v, want %v (%+v)", res.OOMKilled, tt.wantOOM, res)
				}
				if res.MemoryPeak == 0 || res.MemoryPeak > uint64(limit) {
					t.Errorf("MemoryPeak = %d, want in (0, %d]", res.MemoryPeak, limit)
				}
			})
		}
	})
}

func TestUsage(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		res, _ := run(t, m, sh("busy", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"))
		if res.CPU < 10*time.Millisecond {
			t.Errorf("CPU = %s, want a busy loop's worth", res.CPU)
		}
		_, peak := m.h.(*v1Hierarchy)
		if h, ok := m.h.(*v2Hierarchy); ok {
			b, _ := os.ReadFile(filepath.Join(h.dir, "cgroup.subtree_control"))
			peak = slices.Contains(strings.Fields(string(b)), "memory")
		}
		if peak && res.MemoryPeak == 0 {
			t.Error("MemoryPeak = 0")
		}
	})
}

func TestPidsLimit(t *testing.T) {
	limit := int64(40)
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		p := startLimited(t, m, sh("storm", "for i in $(seq 300); do sleep 2 & done; wait"),
			&specs.LinuxResources{Pids: &specs.LinuxPids{Limit: &limit}})
		out := drain(t, p.Output())
		most := 0
		for running := true; running; {
			select {
			case <-p.done:
				running = false
			case <-time.After(time.Millisecond):
				most = max(most, len(groupPids(t, p)))
			}
		}
		if _, err := p.Wait(); err != nil {
			t.Errorf("Wait: %v", err)
		}
		out()
		t.Logf("most processes seen at once: %d", most)
		if most > int(limit) || most < int(limit)/2 {
			t.Errorf("at most %d processes seen, want between %d and %d", most, limit/2, limit)
		}
	})
}

func TestSweep(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		// The old Manager keeps no warm init steps, so that the count below is its one job.
		warm := cfg.Warm
		cfg.Warm = -1
		old, cfg := newTestManager(t, cfg)
		cfg.Warm = warm
		arg := daemonArg()
		p, err := old.Start(sh("abandoned", "setsid sleep "+arg+" & echo $!; sleep 1000"))
		if err != nil {
			t.Fatal(err)
		}
		line := make([]byte, 32)
		n, err := p.Output().Read(line)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := strconv.Atoi(strings.TrimSpace(string(line[:n]))); err != nil {
			t.Fatal(err)
		}
		out := drain(t, p.Output())

		if n, err := old.Sweep(); n != 0 || err != nil {
			t.Errorf("Sweep spared nothing of its own live job: %d, %v", n, err)
		}

		m, _ := newTestManager(t, cfg)
		n, err = m.Sweep()
		if n != 1 || err != nil {
			t.Errorf("Sweep() = %d, %v; want 1", n, err)
		}
		if pids := survivors(t, arg); len(pids) > 0 {
			t.Errorf("daemon %v survived the sweep", pids)
		}
		// The abandoned job's own Process removes its cgroup too, concurrently with the sweep (which
		// happens only in tests: a real sweep finds an earlier life's cgroups, with no one else
		// removing them): look once both are done.
		if res, err := p.Wait(); res.Signal != 9 || err != nil {
			t.Errorf("abandoned job: %+v, %v; want SIGKILL", res, err)
		}
		if left, err := jobCgroups(m); len(left) != 0 || err != nil {
			t.Errorf("after sweep: %v, %v", left, err)
		}
		out()
	})
}

// TestResources checks how limits become the library's resources, without a kernel: the v2 root is
// a temporary directory holding the files resources reads.
func TestResources(t *testing.T) {
	i64 := func(n int64) *int64 { return &n }
	u64 := func(n uint64) *uint64 { return &n }
	tests := []struct {
		name    string
		l       limits
		noSwap  bool   // swap accounting off
		enabled string // v2 root's cgroup.subtree_control
		v1Err   error
		v2Err   error
		// v1: memory.limit_in_bytes, memory.memsw.limit_in_bytes, cpu.cfs_quota_us, pids.max (nil: unset)
		v1Mem, v1Memsw, v1Quota, v1Pids *int64
		// v2: memory.max, memory.swap.max (nil: unset), cpu.max, pids.max (0: unset)
		v2Max, v2Swap *int64
		v2CPU         string
		v2Pids        int64
	}{
		{name: "none", enabled: "cpu memory pids"},
		{name: "memory caps swap", l: limits{memory: i64(64 << 20)}, enabled: "memory",
			v1Mem: i64(64 << 20), v1Memsw: i64(64 << 20), v2Max: i64(64 << 20), v2Swap: i64(0)},
		{name: "memory and swap", l: limits{memory: i64(64 << 20), swap: i64(96 << 20)}, enabled: "memory",
			v1Mem: i64(64 << 20), v1Memsw: i64(96 << 20), v2Max: i64(64 << 20), v2Swap: i64(32 << 20)},
		{name: "memory unlimited", l: limits{memory: i64(-1)}, enabled: "memory",
			v1Mem: i64(-1), v1Memsw: i64(-1), v2Swap: i64(0)},
		{name: "memory without swap accounting", l: limits{memory: i64(64 << 20)}, noSwap: true, enabled: "memory",
			v1Mem: i64(64 << 20), v2Max: i64(64 << 20)},
		{name: "swap without swap accounting", l: limits{swap: i64(64 << 20)}, noSwap: true, enabled: "memory",
			v1Err: ErrNoController, v2Err: ErrNoController},
		{name: "quota without period", l: limits{quota: i64(50000)}, enabled: "cpu",
			v1Quota: i64(50000), v2CPU: "50000 100000"},
		{name: "quota and period", l: limits{quota: i64(20000), period: u64(40000)}, enabled: "cpu",
			v1Quota: i64(20000), v2CPU: "20000 40000"},
		{name: "no quota", l: limits{quota: i64(-1)}, enabled: "cpu", v1Quota: i64(-1), v2CPU: "max 100000"},
		{name: "pids", l: limits{pids: i64(40)}, enabled: "pids", v1Pids: i64(40), v2Pids: 40},
		{name: "pids unlimited", l: limits{pids: i64(0)}, enabled: "pids", v1Pids: i64(0), v2Pids: -1},
		// v1 only checks that a controller is mounted, in create.
		{name: "controller not enabled", l: limits{pids: i64(40)}, enabled: "cpu memory", v1Pids: i64(40), v2Err: ErrNoController},
	}
	eq := func(a, b *int64) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }
	str := func(p *int64) string {
		if p == nil {
			return "unset"
		}
		return strconv.FormatInt(*p, 10)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v1, err := (&v1Hierarchy{memsw: !tt.noSwap}).resources(tt.l)
			switch {
			case !errors.Is(err, tt.v1Err) || (err == nil) != (tt.v1Err == nil):
				t.Errorf("v1: %v, want %v", err, tt.v1Err)
			case err == nil:
				var mem, memsw, quota, pids *int64
				if v1.Memory != nil {
					mem, memsw = v1.Memory.Limit, v1.Memory.Swap
				}
				if v1.CPU != nil {
					quota = v1.CPU.Quota
				}
				if v1.Pids != nil {
					pids = v1.Pids.Limit
				}
				if !eq(mem, tt.v1Mem) || !eq(memsw, tt.v1Memsw) || !eq(quota, tt.v1Quota) || !eq(pids, tt.v1Pids) {
					t.Errorf("v1: memory %s memsw %s quota %s pids %s", str(mem), str(memsw), str(quota), str(pids))
				}
			}

			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(tt.enabled+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if !tt.noSwap {
				if err := os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("max\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			v2, err := (&v2Hierarchy{dir: dir}).resources(tt.l)
			if !errors.Is(err, tt.v2Err) || (err == nil) != (tt.v2Err == nil) {
				t.Fatalf("v2: %v, want %v", err, tt.v2Err)
			}
			if err != nil {
				return
			}
			var max, swap *int64
			var cpu string
			var pids int64
			if v2.Memory != nil {
				max, swap = v2.Memory.Max, v2.Memory.Swap
			}
			if v2.CPU != nil {
				cpu = string(v2.CPU.Max)
			}
			if v2.Pids != nil {
				pids = v2.Pids.Max
			}
			if !eq(max, tt.v2Max) || !eq(swap, tt.v2Swap) || cpu != tt.v2CPU || pids != tt.v2Pids {
				t.Errorf("v2: memory.max %s swap.max %s cpu.max %q pids %d", str(max), str(swap), cpu, pids)
			}
		})
	}
}

// TestPidsChildCgroup: a process that a (root) job moved into a cgroup of its own below the job's is
// still the job's: listed, and killed with it.
func TestPidsChildCgroup(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		arg := daemonArg()
		p, err := m.Start(sh("child-cgroup", "sleep "+arg+" & wait"))
		if err != nil {
			t.Fatal(err)
		}
		out := drain(t, p.Output())
		var sleeper []int
		poll.Until(t, 10*time.Second, "the job's sleep", func() bool { sleeper = survivors(t, arg); return len(sleeper) == 1 })
		var dirs []string // on v1, every hierarchy's: the job's cgroup in one would still list it
		switch g := p.g.(type) {
		case *v1Group:
			dirs = g.dirs
		case *v2Group:
			dirs = []string{g.dir}
		}
		for _, dir := range dirs {
			child := filepath.Join(dir, "child")
			if err := os.Mkdir(child, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(child, "cgroup.procs"), []byte(strconv.Itoa(sleeper[0])), 0); err != nil {
				t.Fatal(err)
			}
		}
		if pids := groupPids(t, p); !slices.Contains(pids, sleeper[0]) {
			t.Errorf("the job's processes %v lack %d, in its child cgroup", pids, sleeper[0])
		}
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Wait(); err != nil {
			t.Errorf("Wait: %v", err)
		}
		out()
		if left := survivors(t, arg); len(left) > 0 {
			t.Errorf("%v survived the kill", left)
		}
	})
}
