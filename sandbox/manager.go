// Package sandbox runs one job's command inside its own cgroup and pid namespace: started already
// inside them, limited, accounted, and killed as a whole, on cgroup v1 (legacy or hybrid) and v2.
//
// A runner calls MaybeInit first thing in main (every job starts through a re-executed copy of the
// binary), makes one Manager, calls Sweep once to clear what an earlier life left, StartFence to have
// its jobs killed when it stops renewing the fence or dies (fence.go), ProbeReadonly once to learn
// whether readonly jobs (Spec.Readonly: bwrap and a seccomp filter) can run here, and then, per job,
// Start, reads Output to EOF while calling Wait, and Kill to cancel.
package sandbox

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/cgroups/v3"
	"golang.org/x/sys/unix"
)

var (
	// ErrInvalidConfig reports a Config that NewManager cannot use.
	ErrInvalidConfig = errors.New("sandbox: invalid config")
	// ErrNoCgroups reports that the requested cgroup hierarchy is not mounted.
	ErrNoCgroups = errors.New("sandbox: cgroups not available")
	// ErrNoController reports a limit whose cgroup controller is not available to the job.
	ErrNoController = errors.New("sandbox: cgroup controller not available")
	// ErrJobExists reports a job id whose cgroup already exists.
	ErrJobExists = errors.New("sandbox: job cgroup exists")
)

// defaultKillGrace is how long Kill waits between SIGTERM and SIGKILL.
const defaultKillGrace = 2 * time.Second

// Config configures a Manager.
type Config struct {
	// Root is the runner-owned cgroup under the hierarchy root, e.g. "sbx" or "sbx/runner-1":
	// relative, no "." or ".." elements. Jobs are its children; Sweep owns everything below it.
	Root string
	// Version forces "v1" or "v2"; "" detects: unified → v2, legacy or hybrid → v1.
	Version string
	// Mountpoint is the cgroup2 mount for v2; default /sys/fs/cgroup.
	Mountpoint string
	// KillGrace is the time between SIGTERM and SIGKILL in Kill; default 2s.
	KillGrace time.Duration
	// Bwrap is the bubblewrap binary for readonly jobs, a path or a name looked up in PATH when the
	// first readonly job (or ProbeReadonly) needs it; default "bwrap".
	Bwrap string
	// Hide lists absolute, clean paths that readonly jobs must not see, such as the runner's
	// credentials: when a job starts, a directory is covered by an empty read-only tmpfs, a file by
	// /dev/null, a symlink's target likewise, and a path that does not exist is skipped. Plain jobs
	// see everything.
	Hide []string
	// Warm is how many init steps a v1 Manager keeps joined to spare cgroups, ready for the next jobs
	// (warm.go); default 4, negative for none. v2 needs none.
	Warm int
}

// Manager starts jobs in cgroups below one root it owns.
type Manager struct {
	version string
	grace   time.Duration
	h       hierarchy
	bwrap   string
	hide    []string
	ro      readonlyTools
	warm    *warmPool // nil on v2, without cgo, or with Config.Warm < 0
	// where is the Root, Version and Mountpoint in use, from which a fence finds the same cgroups.
	where Config

	// starting holds a token per Start under way (maxStarting).
	starting chan struct{}

	// mu guards live, the ids of jobs this Manager is running, so that Sweep spares them.
	mu   sync.Mutex
	live map[string]bool
}

// hierarchy is the runner's root cgroup on one cgroup version.
type hierarchy interface {
	// create makes the job's cgroup with its limits applied, before any process is in it.
	create(id string, l limits) (group, error)
	// open returns a job cgroup that already exists, for Sweep; errGone when it no longer does.
	open(id string) (group, error)
	// leftovers lists the job cgroups under the root.
	leftovers() ([]string, error)
	describe() string
}

// NewManager validates cfg, picks the cgroup version and creates the root cgroup(s).
//
// It also marks every descriptor above 2 in this process close-on-exec. Go opens all of its own that
// way, but a runner can inherit open descriptors from whatever started it (a supervisor's pipe), and
// os/exec would pass those on to every job.
func NewManager(cfg Config) (*Manager, error) {
	if err := validRoot(cfg.Root); err != nil {
		return nil, err
	}
	if err := validHide(cfg.Hide); err != nil {
		return nil, err
	}
	if err := cloexecInherited(); err != nil {
		return nil, err
	}
	if cfg.KillGrace <= 0 {
		cfg.KillGrace = defaultKillGrace
	}
	if cfg.Mountpoint == "" {
		cfg.Mountpoint = "/sys/fs/cgroup"
	}
	mode := cgroups.Mode()
	if cfg.Version == "" {
		switch mode {
		case cgroups.Unified:
			cfg.Version = "v2"
		case cgroups.Legacy, cgroups.Hybrid:
			cfg.Version = "v1"
		default:
			return nil, fmt.Errorf("%w: no cgroup mount at /sys/fs/cgroup", ErrNoCgroups)
		}
	}
	m := &Manager{
		version: cfg.Version, grace: cfg.KillGrace, bwrap: cfg.Bwrap, hide: slices.Clone(cfg.Hide), live: make(map[string]bool),
		starting: make(chan struct{}, maxStarting),
		where:    Config{Root: cfg.Root, Version: cfg.Version, Mountpoint: cfg.Mountpoint},
	}
	var err error
	switch cfg.Version {
	case "v1":
		modeName := "legacy"
		if mode == cgroups.Hybrid {
			modeName = "hybrid"
		}
		var h *v1Hierarchy
		h, err = newV1(cfg.Root, modeName)
		if err == nil {
			m.h = h
			if warmInit && cfg.Warm >= 0 {
				m.warm = newWarmPool(m, h, cmp.Or(cfg.Warm, defaultWarm))
			}
		}
	case "v2":
		m.h, err = newV2(cfg.Mountpoint, cfg.Root)
	default:
		return nil, fmt.Errorf("%w: version %q", ErrInvalidConfig, cfg.Version)
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// cloexecInherited sets FD_CLOEXEC on every descriptor above 2: close_range(2) does it in one call
// (Linux 5.11); older kernels get one fcntl per entry in /proc/self/fd.
func cloexecInherited() error {
	if err := unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC); err == nil {
		return nil
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("list descriptors: %w", err)
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= 2 {
			continue
		}
		// EBADF: the descriptor ReadDir itself used, closed by now.
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil && !errors.Is(err, unix.EBADF) {
			return fmt.Errorf("set close-on-exec: %w", err)
		}
	}
	return nil
}

// validRoot accepts a clean relative cgroup path, so that Root cannot name the hierarchy root itself
// or anything outside it.
func validRoot(root string) error {
	if root == "" || strings.HasPrefix(root, "/") || path.Clean(root) != root {
		return fmt.Errorf("%w: root %q must be a clean relative path", ErrInvalidConfig, root)
	}
	for _, elem := range strings.Split(root, "/") {
		if elem == "." || elem == ".." {
			return fmt.Errorf("%w: root %q must not contain %q", ErrInvalidConfig, root, elem)
		}
	}
	return nil
}

// validHide accepts absolute, clean paths other than /, which a readonly job could not run without.
func validHide(paths []string) error {
	for _, p := range paths {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" || strings.IndexByte(p, 0) >= 0 {
			return fmt.Errorf("%w: hide %q must be an absolute, clean path other than /", ErrInvalidConfig, p)
		}
	}
	return nil
}

// Version reports the cgroup version in use, "v1" or "v2".
func (m *Manager) Version() string { return m.version }

// Describe says where jobs go, e.g. "v1 (hybrid) /sbx" or "v2 /sys/fs/cgroup/sbx", for a status page.
func (m *Manager) Describe() string { return m.h.describe() }

// Sweep kills every process in every job cgroup under Root that this Manager is not running — what an
// earlier life of the runner left behind — and removes those cgroups. It reports how many it removed.
// It holds off Start while it runs, so that it never sweeps a job that is starting.
func (m *Manager) Sweep() (int, error) { return m.sweep(true) }

// sweep kills every process in every job cgroup under Root that this Manager is not running and,
// with remove, removes those cgroups. It reports how many it killed.
func (m *Manager) sweep(remove bool) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	names, err := m.h.leftovers()
	if err != nil {
		return 0, fmt.Errorf("sweep: %w", err)
	}
	var errs []error
	n := 0
	for _, name := range names {
		if m.live[name] {
			continue
		}
		g, err := m.h.open(name)
		if errors.Is(err, errGone) {
			n++ // removed meanwhile, which is what Sweep wanted
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sweep %s: %w", name, err))
			continue
		}
		if err := g.kill(); err != nil {
			errs = append(errs, fmt.Errorf("sweep %s: %w", name, err))
			continue
		}
		if remove {
			if err := g.remove(); err != nil {
				errs = append(errs, fmt.Errorf("sweep %s: %w", name, err))
				continue
			}
		}
		n++
	}
	return n, errors.Join(errs...)
}

// Close ends the Manager's warm init steps; jobs it started go on.
func (m *Manager) Close() {
	if m.warm != nil {
		m.warm.close()
	}
}

// maxStarting bounds the Starts under way at once; more wait. A start is mostly system calls that
// block an OS thread (cgroup directories and files, the fork, the init step's exec), and the Go
// runtime keeps every thread it ever made: a runner handed 10,000 jobs at once started thousands at
// a time and kept 5,000 threads after (BenchmarkSleepingJobs), and as many descriptors in flight.
// Forks are one at a time anyway (spawn).
const maxStarting = 16

// Start creates the job's cgroup, applies spec.Resources and starts the command already inside it;
// with spec.Readonly the command is bwrap running spec's program under the readonly filter.
func (m *Manager) Start(spec Spec) (*Process, error) {
	l, err := spec.validate()
	if err != nil {
		return nil, err
	}
	m.starting <- struct{}{}
	defer func() { <-m.starting }()
	// files are the descriptors from 3 on; nil leaves one closed.
	var files []*os.File
	// env is a readonly job's environment as bwrap's --args file (bwrapEnv).
	var env []byte
	readonly := spec.Readonly
	if readonly {
		ro, err := m.ro.get(m.bwrap)
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", spec.ID, err)
		}
		spec, env, err = ro.wrap(spec, m.hide)
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", spec.ID, err)
		}
		prog, err := ro.program()
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", spec.ID, err)
		}
		// The child has its own copies once started; bwrap closes both after reading them.
		defer prog.Close()
		args, err := memfdWith("sbx-bwrap-env", env)
		if err != nil {
			return nil, fmt.Errorf("start %s: readonly: %w", spec.ID, err)
		}
		defer args.Close()
		files = make([]*os.File, argsFD-3) // descriptors 4..argsFD
		files[seccompFD-4], files[argsFD-4] = prog, args
	}
	m.mu.Lock()
	if m.live[spec.ID] {
		m.mu.Unlock()
		return nil, fmt.Errorf("start %s: %w", spec.ID, ErrJobExists)
	}
	m.live[spec.ID] = true
	m.mu.Unlock()
	release := func() {
		m.mu.Lock()
		delete(m.live, spec.ID)
		m.mu.Unlock()
	}
	if m.warm != nil && !spec.Stdin && !spec.SeparateStderr && !spec.TTY {
		if w := m.warm.take(); w != nil {
			if readonly && !w.seccomp {
				w.discard()
				m.warm.refill()
			} else {
				p, err := w.claim(m.warm.h, spec, readonly, env, l, release)
				m.warm.refill()
				if !errors.Is(err, errWarmGone) {
					if err != nil {
						return nil, fmt.Errorf("start %s: %w", spec.ID, err)
					}
					return p, nil
				}
			}
		}
	}
	job, err := memfdWith("sbx-job", jobMessage(spec, readonly))
	if err != nil {
		release()
		return nil, fmt.Errorf("start %s: %w", spec.ID, err)
	}
	defer job.Close()
	if files == nil {
		files = make([]*os.File, jobFD-3)
	}
	files[jobFD-4] = job
	g, err := m.h.create(spec.ID, l)
	if err != nil {
		release()
		return nil, fmt.Errorf("start %s: %w", spec.ID, err)
	}
	p, err := start(g, spec, files, m.grace, release, g.prepare)
	if err == nil {
		if err = <-p.launched; err != nil {
			p.Wait() // the Process has removed the cgroup and released the id
		}
	}
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", spec.ID, err)
	}
	return p, nil
}
