package sandbox

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// v1Controllers are the hierarchies a job joins on cgroup v1: enough to limit it (memory, cpu, pids),
// account it (cpuacct, memory) and stop it whole (freezer). Other mounted hierarchies (blkio, devices,
// systemd…) are left alone: each one costs a directory per job to create, join and remove.
var v1Controllers = []string{"memory", "cpu", "cpuacct", "pids", "freezer"}

// errGone reports a job cgroup that disappeared between listing and opening it.
var errGone = errors.New("cgroup gone")

// v1Hierarchy is the runner's root cgroup in each mounted v1 controller hierarchy.
type v1Hierarchy struct {
	root   string
	mode   string            // "legacy" or "hybrid", for describe
	mounts map[string]string // controller → mountpoint, for the v1Controllers that are mounted
	// subsystems are the library's controllers for mounts, in v1Controllers order.
	subsystems []cgroup1.Subsystem
	// via is, for a controller whose mountpoint is not named after it, the way from where the library
	// looks for it to where it is; see path.
	via map[cgroup1.Name]string
	// memsw is whether memory+swap can be limited (swap accounting on).
	memsw bool
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
	h := newV1Hierarchy(root, mode, mounts)
	if _, err := cgroup1.New(h.path(root), &specs.LinuxResources{}, h.opts()...); err != nil {
		return nil, fmt.Errorf("create root cgroup: %w", err)
	}
	return h, nil
}

// newV1Hierarchy builds the library's controllers for mounts, in v1Controllers order.
func newV1Hierarchy(root, mode string, mounts map[string]string) *v1Hierarchy {
	h := &v1Hierarchy{root: root, mode: mode, mounts: mounts, via: make(map[cgroup1.Name]string)}
	for _, c := range v1Controllers {
		mp, ok := mounts[c]
		if !ok {
			continue
		}
		// The library places controller c at <parent>/<c>, as in /sys/fs/cgroup/memory.
		parent := filepath.Dir(mp)
		var s cgroup1.Subsystem
		switch c {
		case "memory":
			// Only memory.max_usage_in_bytes and memory.oom_control are read; the swap and kernel
			// memory files are missing on some kernels, which would fail Stat.
			s = cgroup1.NewMemory(parent, cgroup1.IgnoreModules("memsw", "kmem", "kmem.tcp"))
			h.memsw = exists(filepath.Join(mp, "memory.memsw.limit_in_bytes"))
		case "cpu":
			s = cgroup1.NewCpu(parent)
		case "cpuacct":
			s = cgroup1.NewCpuacct(parent)
		case "pids":
			s = cgroup1.NewPids(parent)
		case "freezer":
			s = cgroup1.NewFreezer(parent)
		}
		if base := filepath.Base(mp); base != c {
			h.via[s.Name()] = filepath.Join("..", base)
		}
		h.subsystems = append(h.subsystems, s)
	}
	return h
}

// opts restricts the library to h's subsystems; by default it would use every mounted hierarchy.
func (h *v1Hierarchy) opts() []cgroup1.InitOpts {
	return []cgroup1.InitOpts{cgroup1.WithHierarchy(func() ([]cgroup1.Subsystem, error) { return h.subsystems, nil })}
}

// path is rel (e.g. "sbx/job-1") in every hierarchy, like cgroup1.StaticPath. A controller mounted
// under another name (cpu in /sys/fs/cgroup/cpu,cpuacct, without the usual cpu symlink) is reached
// from the library's <parent>/cpu through "../cpu,cpuacct", which the library's filepath.Join cleans.
func (h *v1Hierarchy) path(rel string) cgroup1.Path {
	return func(n cgroup1.Name) (string, error) {
		return filepath.Join(cmp.Or(h.via[n], "/"), rel), nil
	}
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

// group wraps the library's cgroup for job id with the directories the init step and kill use.
func (h *v1Hierarchy) group(cg cgroup1.Cgroup, id string) *v1Group {
	dirs := make(map[string]string, len(h.mounts))
	for c, mp := range h.mounts {
		dirs[c] = filepath.Join(mp, h.root, id)
	}
	return &v1Group{cg: cg, dirs: distinct(dirs), freezer: dirs["freezer"], memory: dirs["memory"], cpuacct: dirs["cpuacct"]}
}

func (h *v1Hierarchy) open(id string) (group, error) {
	cg, err := cgroup1.Load(h.path(filepath.Join(h.root, id)), h.opts()...)
	if errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return nil, errGone
	}
	if err != nil {
		return nil, fmt.Errorf("load cgroup: %w", err)
	}
	return h.group(cg, id), nil
}

// leftovers lists the job cgroups under the root in any hierarchy; the library has no listing of
// child cgroups.
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
	for _, need := range []struct {
		controller string
		set        bool
	}{
		{"memory", l.memory != nil || l.swap != nil},
		{"cpu", l.quota != nil || l.period != nil},
		{"pids", l.pids != nil},
	} {
		if _, ok := h.mounts[need.controller]; need.set && !ok {
			return nil, fmt.Errorf("%w: %s (not mounted)", ErrNoController, need.controller)
		}
	}
	res, err := h.resources(l)
	if err != nil {
		return nil, err
	}
	// The library creates with MkdirAll, which would take over a cgroup left by an earlier life
	// before Sweep has killed what is in it; the Manager's live set makes this check race-free.
	for _, dir := range h.group(nil, id).dirs {
		if exists(dir) {
			return nil, fmt.Errorf("%w: %s", ErrJobExists, dir)
		}
	}
	path := h.path(filepath.Join(h.root, id))
	cg, err := cgroup1.New(path, res, h.opts()...)
	if err != nil {
		err = fmt.Errorf("create cgroup: %w", err)
		// New leaves what it made when a limit fails to apply.
		if cg, lerr := cgroup1.Load(path, h.opts()...); lerr == nil {
			err = errors.Join(err, (&v1Group{cg: cg}).remove())
		}
		return nil, err
	}
	return h.group(cg, id), nil
}

// resources turns l into what the library writes. Memory+swap is capped at the memory limit unless
// swap is given, so a job cannot swap its way past its limit; where swap accounting is off that
// file is missing, which is only an error if swap was asked for. A pids limit of zero or less is the
// kernel's default, max, which the library leaves unwritten.
func (h *v1Hierarchy) resources(l limits) (*specs.LinuxResources, error) {
	res := &specs.LinuxResources{}
	if l.memory != nil || l.swap != nil {
		res.Memory = &specs.LinuxMemory{Limit: l.memory}
		switch {
		case h.memsw:
			res.Memory.Swap = cmp.Or(l.swap, l.memory)
		case l.swap != nil:
			return nil, fmt.Errorf("%w: memory.memsw (swap accounting off)", ErrNoController)
		}
	}
	if l.quota != nil || l.period != nil {
		res.CPU = &specs.LinuxCPU{Quota: l.quota, Period: l.period}
	}
	if l.pids != nil {
		res.Pids = &specs.LinuxPids{Limit: l.pids}
	}
	return res, nil
}

// v1Group is one job's cgroup in each v1 controller hierarchy.
type v1Group struct {
	cg      cgroup1.Cgroup
	dirs    []string // the cgroup's directory in each distinct hierarchy
	freezer string   // the cgroup's directory in the freezer hierarchy; "" without one
	memory  string   // ... in the memory hierarchy; "" without one
	cpuacct string   // ... in the cpuacct hierarchy; "" without one
}

// prepare gives the init step the cgroup.procs files to join (v1 has no way to fork straight into a
// cgroup): it joins every hierarchy's before it reads its job (see init.go).
func (g *v1Group) prepare(cmd *exec.Cmd) (func(error) error, error) {
	var procs []string
	for _, dir := range g.dirs {
		procs = append(procs, filepath.Join(dir, "cgroup.procs"))
	}
	cmd.Args = initArgs(procs)
	return func(err error) error { return err }, nil
}

// signal sends sig to each process, frozen around the listing where there is a freezer.
func (g *v1Group) signal(sig unix.Signal) error {
	var freeze func(bool) error
	if g.freezer != "" {
		freeze = g.freeze
	}
	return signalAll(g.pids, freeze, sig)
}

// kill freezes, kills each process and thaws (v1 has no cgroup.kill), until the group is empty.
func (g *v1Group) kill() error {
	var freeze func(bool) error
	if g.freezer != "" {
		freeze = g.freeze
	}
	return killAll(g.pids, g.empty, freeze)
}

// pids lists the processes in the group and below it across all hierarchies: a process can only
// leave one of them by writing another cgroup.procs, which a root job could do.
func (g *v1Group) pids() ([]int, error) {
	var all []int
	for _, dir := range g.dirs {
		var err error
		if all, err = procsBelow(dir, all); err != nil {
			return nil, err
		}
	}
	return all, nil
}

// empty reports whether no hierarchy's cgroup holds a process or a child cgroup — how most jobs end.
// It reads each cgroup.procs once instead of walking every hierarchy through the library, which costs
// about a millisecond per job; anything else (or an error) goes the full way.
func (g *v1Group) empty() bool {
	for _, dir := range g.dirs {
		procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil || len(procs) > 0 {
			return false
		}
		if children, err := subdirs(dir); err != nil || len(children) > 0 {
			return false
		}
	}
	return true
}

// freeze freezes or thaws the group. Freezing writes freezer.state itself and waits at most a second
// for FROZEN: the library's Freeze waits without bound, and a task in uninterruptible sleep never
// freezes, so it would hang the kill; such a task is killed unfrozen instead. A cgroup removed
// meanwhile (by a concurrent Sweep) has nothing left to freeze.
func (g *v1Group) freeze(on bool) error {
	if !on {
		if err := g.cg.Thaw(); err != nil && !removed(err) && !errors.Is(err, cgroup1.ErrCgroupDeleted) {
			return err
		}
		return nil
	}
	if err := writeValue(filepath.Join(g.freezer, "freezer.state"), "FROZEN"); err != nil {
		if removed(err) {
			return nil
		}
		return err
	}
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if s := g.cg.State(); s == cgroup1.Frozen || s == cgroup1.Deleted {
			break
		}
	}
	return nil
}

func (g *v1Group) usage() (usage, error) {
	// Three files, read directly: the library's Stat reads every file of every hierarchy, about a
	// millisecond per job. A file a kernel lacks, or a group removed meanwhile (a concurrent Sweep;
	// ENODEV from a file whose directory is going), reads as zero.
	var u usage
	read := func(path, key string) (uint64, error) {
		var v uint64
		var err error
		if key == "" {
			v, err = readUint(path)
		} else {
			v, err = readKey(path, key)
		}
		if removed(err) {
			return 0, nil
		}
		return v, err
	}
	if g.cpuacct != "" {
		ns, err := read(filepath.Join(g.cpuacct, "cpuacct.usage"), "")
		if err != nil {
			return u, err
		}
		u.cpu = time.Duration(ns)
	}
	if g.memory != "" {
		peak, err := read(filepath.Join(g.memory, "memory.max_usage_in_bytes"), "")
		if err != nil {
			return u, err
		}
		oom, err := read(filepath.Join(g.memory, "memory.oom_control"), "oom_kill")
		if err != nil {
			return u, err
		}
		u.memoryPeak, u.oomKilled = peak, oom > 0
	}
	return u, nil
}

// remove deletes the group in every hierarchy; a group already gone is not an error. A cgroup whose
// last process is still exiting refuses removal for a moment beyond the library's own retries.
func (g *v1Group) remove() error {
	return retryRemove(func() error {
		// An empty group, how every job ends once killed, is its directories: removed directly.
		// The library's Delete first walks every hierarchy for processes to move out, a tenth of
		// the runner's CPU per short job.
		if g.empty() {
			return g.rmdirs()
		}
		err := g.cg.Delete()
		if errors.Is(err, cgroup1.ErrCgroupDeleted) {
			return nil
		}
		return err
	})
}

// rmdirs removes the group's directory in each hierarchy; one already gone counts as removed.
func (g *v1Group) rmdirs() error {
	for _, dir := range g.dirs {
		if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return nil
}

func (g *v1Group) own() []string { return g.dirs }
