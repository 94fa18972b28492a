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
		old, cfg := newTestManager(t, cfg)
		p, err := old.Start(sh("abandoned", "setsid sleep 1000 & echo $!; sleep 1000"))
		if err != nil {
			t.Fatal(err)
		}
		line := make([]byte, 32)
		n, err := p.Output().Read(line)
		if err != nil {
			t.Fatal(err)
		}
		daemon, err := strconv.Atoi(strings.TrimSpace(string(line[:n])))
		if err != nil {
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
		if !gone(daemon) {
			t.Errorf("daemon %d survived the sweep", daemon)
		}
		if left, err := m.h.leftovers(); len(left) != 0 || err != nil {
			t.Errorf("after sweep: %v, %v", left, err)
		}
		if res, err := p.Wait(); res.Signal != 9 || err != nil {
			t.Errorf("abandoned job: %+v, %v; want SIGKILL", res, err)
		}
		out()
	})
}
