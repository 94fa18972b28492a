package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// killTimeout bounds how long killing a cgroup may take before it is reported as stuck; a task in
// uninterruptible sleep (e.g. on a dead NFS server) can outlast any SIGKILL.
const killTimeout = 10 * time.Second

// group is one job's cgroup (one directory on v2, one per controller hierarchy on v1), handled
// through github.com/containerd/cgroups/v3 (cgroupv1.go, cgroupv2.go).
type group interface {
	// prepare makes cmd start its process inside the group. started must be called with cmd.Start's
	// result; it releases what prepare opened and returns the final start error.
	prepare(cmd *exec.Cmd) (started func(error) error, err error)
	// kill kills every process in the group and waits, bounded, until it is empty.
	kill() error
	// signal sends sig once to every process in the group.
	signal(sig unix.Signal) error
	// pids lists the processes in the group.
	pids() ([]int, error)
	// usage reads the accounting; counters a kernel or hierarchy lacks read as zero.
	usage() (usage, error)
	// remove removes the group's directories and any below them; a group already gone is not an
	// error.
	remove() error
	// own lists the group's own directories: one per v1 hierarchy, the one v2 directory.
	own() []string
}

// initExitWait bounds how long a finished job's group is left to its init step alone.
const initExitWait = time.Second

// initAlone reports whether the group holds the init step (pid) and nothing else, or nothing at
// all: how a job ends whose processes have all exited. The init exits by itself once it has reaped
// the last process of its namespace, a moment after it reported the job's status, but under load
// that moment can pass killAll's settleTime; killing it then (on v1: freeze, list every hierarchy,
// kill, thaw) cost more of the runner's CPU than the rest of a short job. The group is read once,
// each directory's cgroup.procs without descending: anything else there (another process, a child
// cgroup, an error) leaves the init to the kill.
func initAlone(g group, pid int) bool {
	alone := strconv.Itoa(pid) + "\n"
	for _, dir := range g.own() {
		procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil || len(procs) > 0 && string(procs) != alone {
			return false
		}
		if children, err := subdirs(dir); err != nil || len(children) > 0 {
			return false
		}
	}
	return true
}

// awaitInitExit waits, up to initExitWait, for the init step (pid) to exit. The wait is on a
// pidfd, which becomes readable when the init exits, before it is reaped: its pid cannot be reused
// meanwhile.
func awaitInitExit(pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone already, or a kernel before 5.3: the kill settles it
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for deadline := time.Now().Add(initExitWait); ; {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		if _, err := unix.Poll(fds, int(left.Milliseconds())+1); err != unix.EINTR {
			return
		}
	}
}

// usage is what a group accounted for the job.
type usage struct {
	cpu        time.Duration
	memoryPeak uint64
	oomKilled  bool
}

// writeValue writes value to an existing control file; unlike os.WriteFile it never creates one.
func writeValue(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// readUint reads a control file holding one number.
func readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return n, nil
}

// readKey reads key's value from a flat-keyed control file ("key value" lines); a missing file or
// key reads as 0.
func readKey(path, key string) (uint64, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || k != key {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s %s: %w", path, key, err)
		}
		return n, nil
	}
	return 0, sc.Err()
}

// removed reports whether err means the cgroup is gone or going: ENODEV comes from a control file
// whose directory is being removed.
func removed(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENODEV)
}

// exists reports whether a control file is present; some depend on kernel options (swap accounting).
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// procsBelow appends to pids the processes of the cgroup dir and of every cgroup below it, each once,
// reading cgroup.procs files. It looks for child cgroups only where there are some: cgroupfs (kernfs)
// keeps a directory's link count at 2 plus its subdirectories. The library's recursive listings walk
// with filepath.Walk, which lstat's every control file of every cgroup: about a millisecond a job,
// which the runner's activity scan (Process.Activity) paid every second for each running job, and
// with a thousand of them took the runner's whole CPU. A cgroup removed meanwhile has none.
func procsBelow(dir string, pids []int) ([]int, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if removed(err) {
		return pids, nil
	}
	if err != nil {
		return nil, err
	}
	for line := range strings.Lines(string(raw)) {
		pid, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil {
			return nil, fmt.Errorf("%s/cgroup.procs: %w", dir, err)
		}
		if !slices.Contains(pids, pid) {
			pids = append(pids, pid)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		if removed(err) {
			return pids, nil
		}
		return nil, err
	}
	if st.Nlink == 2 {
		return pids, nil
	}
	children, err := subdirs(dir)
	if err != nil {
		return nil, err
	}
	for _, c := range children {
		if pids, err = procsBelow(filepath.Join(dir, c), pids); err != nil {
			return nil, err
		}
	}
	return pids, nil
}

// subdirs lists the child cgroups of dir; a dir that is gone has none.
func subdirs(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if removed(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// settleTime is how long killAll lets a group empty by itself before it freezes it.
const settleTime = 10 * time.Millisecond

// killAll SIGKILLs the processes pids lists until there are none. freeze, when not nil, stops the
// group around each listing so that no process forks or exits — and so no pid is reused — between
// reading a pid and killing it; the killed processes die once thawed. An empty group is left alone:
// nothing can enter it by forking, and freezing costs milliseconds on v1. So does a group that is
// about to be empty: processes that are already dying (a sandbox's init after its command, a pid
// namespace being torn down) are given settleTime to go before the group is frozen, watched with
// empty, which must be cheap: listing every hierarchy's pids on v1 each time cost more CPU than
// the rest of a short job.
func killAll(pids func() ([]int, error), empty func() bool, freeze func(bool) error) error {
	deadline := time.Now().Add(killTimeout)
	for settled := time.Now().Add(settleTime); time.Now().Before(settled); time.Sleep(settleTime / 20) {
		if empty() {
			return nil
		}
	}
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		if ps, err := pids(); err != nil || len(ps) == 0 {
			return err
		}
		if freeze != nil {
			if err := freeze(true); err != nil {
				return fmt.Errorf("freeze: %w", err)
			}
		}
		ps, err := pids()
		for _, pid := range ps {
			// ESRCH: already dead; nothing else can fail for root sending SIGKILL.
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		if freeze != nil {
			if terr := freeze(false); terr != nil && err == nil {
				err = fmt.Errorf("thaw: %w", terr)
			}
		}
		if err != nil {
			return err
		}
		if len(ps) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup still holds %d processes after %s", len(ps), killTimeout)
		}
		time.Sleep(wait)
	}
}

// signalAll sends sig once to every process pids lists. freeze, when not nil, stops the group around
// the listing, so that no listed pid exits and is reused by a process outside the group before it is
// signalled; the signal is delivered when the group thaws.
func signalAll(pids func() ([]int, error), freeze func(bool) error, sig unix.Signal) error {
	if ps, err := pids(); err != nil || len(ps) == 0 {
		return err
	}
	if freeze != nil {
		if err := freeze(true); err != nil {
			return fmt.Errorf("freeze: %w", err)
		}
	}
	ps, err := pids()
	for _, pid := range ps {
		_ = unix.Kill(pid, sig) // ESRCH: it exited before the freeze
	}
	if freeze != nil {
		if terr := freeze(false); terr != nil && err == nil {
			err = fmt.Errorf("thaw: %w", terr)
		}
	}
	return err
}

// waitEmptyUntil waits until pids lists nothing or the deadline passes.
func waitEmptyUntil(pids func() ([]int, error), deadline time.Time) {
	for wait := time.Millisecond; time.Now().Before(deadline); wait = min(2*wait, 20*time.Millisecond) {
		if ps, err := pids(); err != nil || len(ps) == 0 {
			return
		}
		time.Sleep(min(wait, time.Until(deadline)))
	}
}

// waitEmptyOrKicked waits until pids lists nothing or kicked is closed. The cgroup has no
// notification of its own on v1, so it is looked at every 100 ms at most: a lingering job's end is
// that much late.
func waitEmptyOrKicked(pids func() ([]int, error), kicked <-chan struct{}) {
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		if ps, err := pids(); err != nil || len(ps) == 0 {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-kicked:
			t.Stop()
			return
		case <-t.C:
		}
	}
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

// retryRemove calls remove, the library's Delete, until it succeeds or killTimeout passes. A cgroup
// whose last process is still exiting refuses rmdir with EBUSY for a moment, and the library gives up
// after about 150 ms.
func retryRemove(remove func() error) error {
	deadline := time.Now().Add(killTimeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		err := remove()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup: %w", err)
		}
		time.Sleep(wait)
	}
}

// distinct returns the distinct values of m, sorted: controllers that share a v1 hierarchy share a
// directory, which must be created and removed once.
func distinct(m map[string]string) []string {
	var out []string
	for _, v := range m {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}
