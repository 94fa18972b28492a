package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2"
	"golang.org/x/sys/unix"
)

// v2Controllers are the controllers a job's limits and accounting need on cgroup v2.
var v2Controllers = []string{"cpu", "memory", "pids"}

// v2Hierarchy is the runner's root cgroup on a cgroup2 mount.
type v2Hierarchy struct {
	mount string
	group string // "/" + root, the library's name for the root cgroup
	dir   string // mount/root
}

// newV2 creates the root cgroup and enables v2Controllers for its children where the mount offers
// them. Enabling may legitimately fail — a cgroup holding processes cannot delegate controllers (the
// "no internal processes" rule), as when the runner sits in its container's root — so failures are
// not returned here: a job that asks for a limit then fails with ErrNoController naming it.
func newV2(mount, root string) (*v2Hierarchy, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(mount, &st); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCgroups, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return nil, fmt.Errorf("%w: %s is not a cgroup2 mount", ErrNoCgroups, mount)
	}
	h := &v2Hierarchy{mount: mount, group: "/" + root, dir: filepath.Join(mount, root)}
	m, err := cgroup2.NewManager(mount, h.group, &cgroup2.Resources{})
	if err != nil {
		return nil, fmt.Errorf("create root cgroup: %w", err)
	}
	have, err := m.RootControllers()
	if err != nil {
		return nil, fmt.Errorf("read controllers: %w", err)
	}
	var enable []string
	for _, c := range have {
		if slices.Contains(v2Controllers, c) {
			enable = append(enable, c)
		}
	}
	if len(enable) > 0 {
		// ToggleControllers enables in every ancestor of a group, so that of a job under the root
		// (only named, not created) enables them from the mount down to the root's children. Jobs
		// without limits need memory and cpu enabled too, for their peak memory and CPU time.
		// See above for why the error is dropped.
		job, err := cgroup2.Load(h.group+"/job", cgroup2.WithMountpoint(mount))
		if err != nil {
			return nil, fmt.Errorf("enable controllers: %w", err)
		}
		_ = job.ToggleControllers(enable, cgroup2.Enable)
	}
	return h, nil
}

func (h *v2Hierarchy) describe() string { return "v2 " + h.dir }

func (h *v2Hierarchy) open(id string) (group, error) {
	m, err := cgroup2.Load(h.group+"/"+id, cgroup2.WithMountpoint(h.mount))
	if err != nil {
		return nil, fmt.Errorf("load cgroup: %w", err)
	}
	return &v2Group{m: m, dir: filepath.Join(h.dir, id)}, nil
}

// leftovers lists the job cgroups under the root; the library has no listing of child cgroups.
func (h *v2Hierarchy) leftovers() ([]string, error) { return subdirs(h.dir) }

func (h *v2Hierarchy) create(id string, l limits) (group, error) {
	res, err := h.resources(l)
	if err != nil {
		return nil, err
	}
	// The library creates with MkdirAll, which would take over a cgroup left by an earlier life
	// before Sweep has killed what is in it; the Manager's live set makes this check race-free.
	dir := filepath.Join(h.dir, id)
	if exists(dir) {
		return nil, fmt.Errorf("%w: %s", ErrJobExists, dir)
	}
	// NewManager enables the controllers res needs in every ancestor (already done by newV2), makes
	// the directory and writes the limits; on failure it removes the directory.
	m, err := cgroup2.NewManager(h.mount, h.group+"/"+id, res)
	if err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	return &v2Group{m: m, dir: dir}, nil
}

// resources turns l into what the library writes, after checking that the root offers its
// controllers to jobs. It is built here rather than by cgroup2.ToResources, which drops a quota given
// without a period and writes a negative (unlimited) byte limit as a number the kernel refuses.
//
// As on v1, swap is capped so that memory+swap stays at the memory limit unless swap is given (v1
// semantics: memory+swap); memory.swap.max is missing without swap accounting, which is only an error
// if swap was asked for. Unlimited values are left unwritten: a new cgroup starts at max.
func (h *v2Hierarchy) resources(l limits) (*cgroup2.Resources, error) {
	enabled, err := os.ReadFile(filepath.Join(h.dir, "cgroup.subtree_control"))
	if err != nil {
		return nil, fmt.Errorf("read controllers: %w", err)
	}
	need := func(c string) error {
		if !slices.Contains(strings.Fields(string(enabled)), c) {
			return fmt.Errorf("%w: %s (not enabled in %s)", ErrNoController, c, h.dir)
		}
		return nil
	}
	res := &cgroup2.Resources{}
	if l.memory != nil || l.swap != nil {
		if err := need("memory"); err != nil {
			return nil, err
		}
		res.Memory = &cgroup2.Memory{}
		if l.memory != nil && *l.memory >= 0 {
			res.Memory.Max = l.memory
		}
		var swap int64
		switch {
		case l.swap != nil && l.memory != nil:
			swap = *l.swap - *l.memory
		case l.swap != nil:
			swap = *l.swap
		}
		// The root's own memory.swap.max exists exactly when its children's do.
		switch {
		case exists(filepath.Join(h.dir, "memory.swap.max")):
			if swap >= 0 {
				res.Memory.Swap = &swap
			}
		case l.swap != nil:
			return nil, fmt.Errorf("%w: memory.swap (swap accounting off)", ErrNoController)
		}
	}
	if l.quota != nil || l.period != nil {
		if err := need("cpu"); err != nil {
			return nil, err
		}
		quota := l.quota
		if quota != nil && *quota <= 0 {
			quota = nil // max
		}
		res.CPU = &cgroup2.CPU{Max: cgroup2.NewCPUMax(quota, l.period)}
	}
	if l.pids != nil {
		if err := need("pids"); err != nil {
			return nil, err
		}
		// Like runc, zero or less means no limit, which the library writes as max when negative.
		res.Pids = &cgroup2.Pids{Max: -1}
		if *l.pids > 0 {
			res.Pids.Max = *l.pids
		}
	}
	return res, nil
}

// v2Group is one job's cgroup on a cgroup2 mount.
type v2Group struct {
	m   *cgroup2.Manager
	dir string
}

// prepare makes clone3 place the child in the group (CLONE_INTO_CGROUP) before it runs anything.
func (g *v2Group) prepare(cmd *exec.Cmd) (func(error) error, error) {
	fd, err := unix.Open(g.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open cgroup: %w", err)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = fd
	cmd.Args = initArgs(nil) // nothing to join
	return func(startErr error) error {
		unix.Close(fd)
		return startErr
	}, nil
}

// signal sends sig to each process, frozen around the listing.
func (g *v2Group) signal(sig unix.Signal) error {
	if !exists(g.dir) {
		return nil
	}
	return signalAll(g.pids, g.freeze, sig)
}

// kill uses the library's Kill, which writes cgroup.kill (Linux 5.14): the whole subtree dies
// atomically, forks included. Older kernels get freeze, kill each, thaw here rather than from the
// library's fallback, which also waits for each killed process and so would reap the job's main
// process from under its exec.Cmd.
func (g *v2Group) kill() error {
	if !exists(g.dir) {
		return nil // removed meanwhile (a concurrent Sweep), so empty
	}
	if exists(filepath.Join(g.dir, "cgroup.kill")) {
		if err := g.m.Kill(); err != nil {
			if removed(err) || !exists(g.dir) {
				return nil
			}
			return fmt.Errorf("kill cgroup: %w", err)
		}
		return waitEmpty(g.pids)
	}
	var freeze func(bool) error
	if exists(filepath.Join(g.dir, "cgroup.freeze")) {
		freeze = g.freeze
	}
	return killAll(g.pids, func() bool { ps, err := g.pids(); return err == nil && len(ps) == 0 }, freeze)
}

// pids lists the processes in the group and below it; a group that is gone holds none.
func (g *v2Group) pids() ([]int, error) {
	return procsBelow(g.dir, nil)
}

// freeze freezes or thaws through the library, then waits at most a second for "frozen 1" in
// cgroup.events: the library returns once cgroup.freeze reads back 1, which is the request, not the
// outcome. A cgroup removed meanwhile (by a concurrent Sweep) has nothing left to freeze.
func (g *v2Group) freeze(on bool) error {
	op := g.m.Thaw
	if on {
		op = g.m.Freeze
	}
	if err := op(); err != nil {
		if removed(err) {
			return nil
		}
		return err
	}
	for deadline := time.Now().Add(time.Second); on && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		frozen, err := readKey(filepath.Join(g.dir, "cgroup.events"), "frozen")
		if removed(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if frozen == 1 {
			break
		}
	}
	return nil
}

// usage reads cpu.stat, memory.peak (through the library's MaxUsage; 0 before Linux 5.19) and
// memory.events. Files a kernel or a group without the memory controller lacks read as zero, and so
// does a group removed meanwhile (ENODEV from a file whose directory is going).
func (g *v2Group) usage() (usage, error) {
	var u usage
	st, err := g.m.StatFiltered(cgroup2.StatCPU | cgroup2.StatMemory | cgroup2.StatMemoryEvents)
	if removed(err) {
		return u, nil // removed meanwhile (a concurrent Sweep): nothing left to read
	}
	if err != nil {
		return u, err
	}
	if st.CPU != nil {
		u.cpu = time.Duration(st.CPU.UsageUsec) * time.Microsecond
	}
	if st.Memory != nil {
		u.memoryPeak = st.Memory.MaxUsage
	}
	if st.MemoryEvents != nil {
		u.oomKilled = st.MemoryEvents.OomKill > 0
	}
	return u, nil
}

// remove deletes the group and any cgroups a job made below it; a group already gone is not an
// error. A cgroup whose last process is still exiting refuses removal for a moment beyond the
// library's own retries.
func (g *v2Group) remove() error {
	return retryRemove(func() error {
		err := g.m.Delete()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	})
}

func (g *v2Group) own() []string { return []string{g.dir} }
