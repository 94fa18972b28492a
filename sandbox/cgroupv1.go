package sandbox

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// v1Controllers are the hierarchies a job joins on cgroup v1: enough to limit it (memory, cpu, pids),
// account it (cpuacct, memory) and stop it whole (freezer).
var v1Controllers = []string{"memory", "cpu", "cpuacct", "pids", "freezer"}

// v1Hierarchy is the runner's root cgroup in each mounted v1 controller hierarchy.
type v1Hierarchy struct {
	root   string
	mode   string            // "legacy" or "hybrid", for describe
	mounts map[string]string // controller → mountpoint, for the v1Controllers that are mounted
}

func newV1(root, mode string) (*v1Hierarchy, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("find cgroup v1 mounts: %w", err)
	}
	defer f.Close()
	mounts, err := v1Mounts(f)
	if err != nil {
		return nil, fmt.Errorf("find cgroup v1 mounts: %w", err)
	}
	if len(mounts) == 0 {
		return nil, fmt.Errorf("%w: no cgroup v1 controller mounted", ErrNoCgroups)
	}
	h := &v1Hierarchy{root: root, mode: mode, mounts: mounts}
	for _, mp := range distinct(mounts) {
		if err := os.MkdirAll(filepath.Join(mp, root), 0o755); err != nil {
			return nil, fmt.Errorf("create root cgroup: %w", err)
		}
	}
	return h, nil
}

// v1Mounts finds the mountpoint of each of v1Controllers in a mountinfo listing. A controller mounted
// twice (a bind mount) keeps its first mountpoint.
func v1Mounts(r io.Reader) (map[string]string, error) {
	mounts := make(map[string]string)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		// 35 24 0:30 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 5 || len(fields) < sep+4 || fields[sep+1] != "cgroup" {
			continue
		}
		for _, opt := range strings.Split(fields[sep+3], ",") {
			if _, seen := mounts[opt]; !seen && slices.Contains(v1Controllers, opt) {
				mounts[opt] = fields[4]
			}
		}
	}
	return mounts, sc.Err()
}

func (h *v1Hierarchy) describe() string {
	return fmt.Sprintf("v1 (%s) /%s", h.mode, h.root)
}

func (h *v1Hierarchy) open(id string) group {
	g := &v1Group{dirs: make(map[string]string, len(h.mounts))}
	for c, mp := range h.mounts {
		g.dirs[c] = filepath.Join(mp, h.root, id)
	}
	return g
}

func (h *v1Hierarchy) leftovers() ([]string, error) {
	var names []string
	for _, mp := range distinct(h.mounts) {
		subs, err := subdirs(filepath.Join(mp, h.root))
		if err != nil {
			return nil, err
		}
		for _, s := range subs {
			if !slices.Contains(names, s) {
				names = append(names, s)
			}
		}
	}
	return names, nil
}

func (h *v1Hierarchy) create(id string, l limits) (group, error) {
	g := h.open(id).(*v1Group)
	for _, need := range []struct {
		controller string
		set        bool
	}{
		{"memory", l.memory != nil || l.swap != nil},
		{"cpu", l.quota != nil || l.period != nil},
		{"pids", l.pids != nil},
	} {
		if _, ok := g.dirs[need.controller]; need.set && !ok {
			return nil, fmt.Errorf("%w: %s (not mounted)", ErrNoController, need.controller)
		}
	}
	var made []string
	for _, dir := range distinct(g.dirs) {
		if err := os.Mkdir(dir, 0o755); err != nil {
			for _, d := range made {
				_ = os.Remove(d) // best effort: the error that matters is the Mkdir one
			}
			if errors.Is(err, fs.ErrExist) {
				return nil, fmt.Errorf("%w: %s", ErrJobExists, dir)
			}
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
		made = append(made, dir)
	}
	if err := g.apply(l); err != nil {
		return nil, errors.Join(err, g.remove())
	}
	return g, nil
}

// v1Group is one job's cgroup in each v1 controller hierarchy.
type v1Group struct {
	dirs map[string]string // controller → cgroup dir
}

// apply writes l to the group. Memory+swap is capped at the memory limit unless swap is given, so a
// job cannot swap its way past its limit; where swap accounting is off that file is missing, which
// is only an error if swap was asked for.
func (g *v1Group) apply(l limits) error {
	mem := g.dirs["memory"]
	if l.memory != nil {
		if err := writeValue(filepath.Join(mem, "memory.limit_in_bytes"), strconv.FormatInt(*l.memory, 10)); err != nil {
			return fmt.Errorf("set memory limit: %w", err)
		}
	}
	if memsw := cmp.Or(l.swap, l.memory); memsw != nil {
		path := filepath.Join(mem, "memory.memsw.limit_in_bytes")
		switch {
		case exists(path):
			if err := writeValue(path, strconv.FormatInt(*memsw, 10)); err != nil {
				return fmt.Errorf("set memory+swap limit: %w", err)
			}
		case l.swap != nil:
			return fmt.Errorf("%w: memory.memsw (swap accounting off)", ErrNoController)
		}
	}
	cpu := g.dirs["cpu"]
	if l.period != nil {
		if err := writeValue(filepath.Join(cpu, "cpu.cfs_period_us"), strconv.FormatUint(*l.period, 10)); err != nil {
			return fmt.Errorf("set cpu period: %w", err)
		}
	}
	if l.quota != nil {
		if err := writeValue(filepath.Join(cpu, "cpu.cfs_quota_us"), strconv.FormatInt(*l.quota, 10)); err != nil {
			return fmt.Errorf("set cpu quota: %w", err)
		}
	}
	if l.pids != nil {
		if err := writeValue(filepath.Join(g.dirs["pids"], "pids.max"), pidsMax(*l.pids)); err != nil {
			return fmt.Errorf("set pids limit: %w", err)
		}
	}
	return nil
}

// prepare turns cmd into the init step: this binary re-executed as initArg0, which joins every
// hierarchy's cgroup.procs and then execs the real command (see MaybeInit). v1 has no way to fork
// straight into a cgroup. The init step reports a failure on fd 3; success closes it empty on exec.
func (g *v1Group) prepare(cmd *exec.Cmd) (func(error) error, error) {
	var procs []string
	for _, dir := range distinct(g.dirs) {
		procs = append(procs, filepath.Join(dir, "cgroup.procs"))
	}
	cmd.Args = initArgs(procs, cmd.Path, cmd.Args)
	cmd.Path = "/proc/self/exe"
	sr, sw, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("status pipe: %w", err)
	}
	cmd.ExtraFiles = []*os.File{sw}
	return func(startErr error) error {
		sw.Close()
		defer sr.Close()
		if startErr != nil {
			return startErr
		}
		msg, err := io.ReadAll(sr)
		if err != nil {
			return fmt.Errorf("read init status: %w", err)
		}
		if len(msg) > 0 {
			return errors.New(string(msg))
		}
		return nil
	}, nil
}

func (g *v1Group) kill() error {
	var freeze func(bool) error
	if dir, ok := g.dirs["freezer"]; ok && exists(dir) {
		freeze = func(on bool) error { return freezeV1(dir, on) }
	}
	return killAll(g.pids, freeze)
}

// pids lists the processes in the group across all hierarchies: a process can only leave one of
// them by writing another cgroup.procs, which a root job could do.
func (g *v1Group) pids() ([]int, error) {
	var all []int
	for _, dir := range distinct(g.dirs) {
		ps, err := readPids(dir)
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			if !slices.Contains(all, p) {
				all = append(all, p)
			}
		}
	}
	return all, nil
}

// freezeV1 freezes or thaws a v1 freezer cgroup and waits, bounded, for freezing to finish; a task
// that will not freeze (uninterruptible sleep) is killed unfrozen rather than block the kill.
func freezeV1(dir string, on bool) error {
	state := "THAWED"
	if on {
		state = "FROZEN"
	}
	path := filepath.Join(dir, "freezer.state")
	// A cgroup removed meanwhile (by a concurrent Sweep) has nothing left to freeze.
	if err := writeValue(path, state); err != nil {
		if removed(err) {
			return nil
		}
		return err
	}
	for deadline := time.Now().Add(time.Second); on && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(path)
		if removed(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(b)) == state {
			break
		}
	}
	return nil
}

func (g *v1Group) usage() (usage, error) {
	var u usage
	if dir, ok := g.dirs["cpuacct"]; ok {
		ns, err := readUint(filepath.Join(dir, "cpuacct.usage"))
		if err != nil {
			return u, err
		}
		u.cpu = time.Duration(ns)
	}
	if dir, ok := g.dirs["memory"]; ok {
		var err error
		if u.memoryPeak, err = readUint(filepath.Join(dir, "memory.max_usage_in_bytes")); err != nil {
			return u, err
		}
		kills, err := readKey(filepath.Join(dir, "memory.oom_control"), "oom_kill")
		if err != nil {
			return u, err
		}
		u.oomKilled = kills > 0
	}
	return u, nil
}

func (g *v1Group) remove() error {
	var errs []error
	for _, dir := range distinct(g.dirs) {
		errs = append(errs, removeTree(dir))
	}
	return errors.Join(errs...)
}

// pidsMax renders a pids limit; like runc, zero or less means no limit.
func pidsMax(n int64) string {
	if n <= 0 {
		return "max"
	}
	return strconv.FormatInt(n, 10)
}
