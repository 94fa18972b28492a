package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// v2Controllers are the controllers a job's limits need on cgroup v2.
var v2Controllers = []string{"cpu", "memory", "pids"}

// defaultCPUPeriod is the kernel's CFS period, used when a quota comes without one.
const defaultCPUPeriod = 100000

// v2Hierarchy is the runner's root cgroup on a cgroup2 mount.
type v2Hierarchy struct {
	dir string // mountpoint/root
}

// newV2 creates the root cgroup and enables v2Controllers for its children where its parents offer
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
	h := &v2Hierarchy{dir: filepath.Join(mount, root)}
	if err := os.MkdirAll(h.dir, 0o755); err != nil {
		return nil, fmt.Errorf("create root cgroup: %w", err)
	}
	dir := mount
	enableControllers(dir)
	for _, elem := range strings.Split(root, "/") {
		dir = filepath.Join(dir, elem)
		enableControllers(dir)
	}
	return h, nil
}

// enableControllers enables in dir's subtree_control those of v2Controllers that dir has.
func enableControllers(dir string) {
	have, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return
	}
	var enable []string
	for _, c := range strings.Fields(string(have)) {
		if slices.Contains(v2Controllers, c) {
			enable = append(enable, "+"+c)
		}
	}
	if len(enable) > 0 {
		// See newV2 for why the error is dropped.
		_ = writeValue(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(enable, " "))
	}
}

func (h *v2Hierarchy) describe() string { return "v2 " + h.dir }

func (h *v2Hierarchy) open(id string) group { return &v2Group{dir: filepath.Join(h.dir, id)} }

func (h *v2Hierarchy) leftovers() ([]string, error) { return subdirs(h.dir) }

func (h *v2Hierarchy) create(id string, l limits) (group, error) {
	g := &v2Group{dir: filepath.Join(h.dir, id)}
	if err := os.Mkdir(g.dir, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("%w: %s", ErrJobExists, g.dir)
		}
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	if err := g.apply(l); err != nil {
		return nil, errors.Join(err, g.remove())
	}
	return g, nil
}

// v2Group is one job's cgroup on a cgroup2 mount.
type v2Group struct {
	dir string
}

// apply writes l to the group. As on v1, swap is capped so memory+swap stays at the memory limit
// unless swap is given (v1 semantics: memory+swap); memory.swap.max is missing without swap
// accounting, which is only an error if swap was asked for.
func (g *v2Group) apply(l limits) error {
	have, err := os.ReadFile(filepath.Join(g.dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("read controllers: %w", err)
	}
	need := func(c string) error {
		if !slices.Contains(strings.Fields(string(have)), c) {
			return fmt.Errorf("%w: %s (not enabled in %s)", ErrNoController, c, filepath.Dir(g.dir))
		}
		return nil
	}
	if l.memory != nil || l.swap != nil {
		if err := need("memory"); err != nil {
			return err
		}
	}
	if l.memory != nil {
		if err := writeValue(filepath.Join(g.dir, "memory.max"), v2Max(*l.memory)); err != nil {
			return fmt.Errorf("set memory limit: %w", err)
		}
	}
	if l.memory != nil || l.swap != nil {
		var swap int64
		switch {
		case l.swap != nil && l.memory != nil:
			swap = *l.swap - *l.memory
		case l.swap != nil:
			swap = *l.swap
		}
		path := filepath.Join(g.dir, "memory.swap.max")
		switch {
		case exists(path):
			if err := writeValue(path, v2Max(swap)); err != nil {
				return fmt.Errorf("set swap limit: %w", err)
			}
		case l.swap != nil:
			return fmt.Errorf("%w: memory.swap (swap accounting off)", ErrNoController)
		}
	}
	if l.quota != nil || l.period != nil {
		if err := need("cpu"); err != nil {
			return err
		}
		quota, period := "max", uint64(defaultCPUPeriod)
		if l.quota != nil && *l.quota > 0 {
			quota = strconv.FormatInt(*l.quota, 10)
		}
		if l.period != nil {
			period = *l.period
		}
		if err := writeValue(filepath.Join(g.dir, "cpu.max"), fmt.Sprintf("%s %d", quota, period)); err != nil {
			return fmt.Errorf("set cpu quota: %w", err)
		}
	}
	if l.pids != nil {
		if err := need("pids"); err != nil {
			return err
		}
		if err := writeValue(filepath.Join(g.dir, "pids.max"), pidsMax(*l.pids)); err != nil {
			return fmt.Errorf("set pids limit: %w", err)
		}
	}
	return nil
}

// v2Max renders a byte limit; negative means no limit, as in the OCI spec.
func v2Max(n int64) string {
	if n < 0 {
		return "max"
	}
	return strconv.FormatInt(n, 10)
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
	return func(startErr error) error {
		unix.Close(fd)
		return startErr
	}, nil
}

// kill uses cgroup.kill (Linux 5.14), which kills the whole subtree atomically, forks included;
// older kernels get freeze, kill each, thaw.
func (g *v2Group) kill() error {
	pids := func() ([]int, error) { return readPids(g.dir) }
	err := writeValue(filepath.Join(g.dir, "cgroup.kill"), "1")
	switch {
	case err == nil:
		return waitEmpty(pids)
	case errors.Is(err, unix.ENODEV) || !exists(g.dir):
		return nil // removed meanwhile (a concurrent Sweep), so empty
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("write cgroup.kill: %w", err)
	}
	freeze := func(on bool) error { return freezeV2(g.dir, on) }
	if !exists(filepath.Join(g.dir, "cgroup.freeze")) {
		freeze = nil
	}
	return killAll(pids, freeze)
}

// waitEmpty waits, bounded, until pids lists nothing: killed processes take a moment to exit.
func waitEmpty(pids func() ([]int, error)) error {
	deadline := time.Now().Add(killTimeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		ps, err := pids()
		if err != nil || len(ps) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup still holds %d processes after %s", len(ps), killTimeout)
		}
		time.Sleep(wait)
	}
}

// freezeV2 freezes or thaws through cgroup.freeze and waits, bounded, for "frozen 1" in cgroup.events.
func freezeV2(dir string, on bool) error {
	value := "0"
	if on {
		value = "1"
	}
	// A cgroup removed meanwhile (by a concurrent Sweep) has nothing left to freeze.
	if err := writeValue(filepath.Join(dir, "cgroup.freeze"), value); err != nil {
		if removed(err) {
			return nil
		}
		return err
	}
	for deadline := time.Now().Add(time.Second); on && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		frozen, err := readKey(filepath.Join(dir, "cgroup.events"), "frozen")
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

func (g *v2Group) usage() (usage, error) {
	var u usage
	usec, err := readKey(filepath.Join(g.dir, "cpu.stat"), "usage_usec")
	if err != nil {
		return u, err
	}
	u.cpu = time.Duration(usec) * time.Microsecond
	if u.memoryPeak, err = readUint(filepath.Join(g.dir, "memory.peak")); err != nil {
		return u, err
	}
	kills, err := readKey(filepath.Join(g.dir, "memory.events"), "oom_kill")
	u.oomKilled = kills > 0
	return u, err
}

func (g *v2Group) remove() error { return removeTree(g.dir) }
