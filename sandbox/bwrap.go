package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// seccompFD is the descriptor on which a readonly job's bwrap reads its seccomp program. Descriptor 3
// is the v1 init step's status pipe (statusFD), so the program is on 4 on both cgroup versions; on v2
// descriptor 3 is left closed.
const seccompFD = statusFD + 1

// bwrapArgs is the argv of bwrap running argv (argv[0] an absolute path) in dir with nothing writable,
// no network, no capabilities, a private /proc and /dev, and the seccomp program read from fd. The
// flags are DESIGN.md's ("Runner: readonly"); docs/readonly.md says what they block.
func bwrapArgs(dir string, fd int, argv []string) []string {
	args := []string{
		"bwrap",
		"--new-session",
		"--die-with-parent",
		"--unshare-all",
		"--ro-bind", "/", "/",
		"--dev", "/dev",
		"--proc", "/proc",
		"--cap-drop", "ALL",
		"--chdir", dir,
		"--seccomp", strconv.Itoa(fd),
		"--",
	}
	return append(args, argv...)
}

// readonlyTools is what a readonly start needs: bwrap's path and the compiled filter. A Manager finds
// them once; a failure stays a failure for the Manager's life.
type readonlyTools struct {
	once  sync.Once
	bwrap string // absolute path
	prog  []byte // the seccomp program, struct sock_filter entries
	err   error
}

// get finds bwrap (bwrap as configured, else "bwrap" on PATH) and compiles the filter, once.
func (t *readonlyTools) get(bwrap string) (*readonlyTools, error) {
	t.once.Do(func() {
		if bwrap == "" {
			bwrap = "bwrap"
		}
		path, err := exec.LookPath(bwrap)
		if err != nil {
			t.err = fmt.Errorf("readonly: find bwrap: %w", err)
			return
		}
		prog, err := compileSeccomp(readonlyFilter)
		if err != nil {
			t.err = fmt.Errorf("readonly: %w", err)
			return
		}
		t.bwrap, t.prog = path, prog
	})
	return t, t.err
}

// wrap turns spec into bwrap running spec's program, and returns the file the program must find on
// seccompFD; the caller closes it once the process has started.
func (t *readonlyTools) wrap(spec Spec) (Spec, *os.File, error) {
	f, err := t.program()
	if err != nil {
		return Spec{}, nil, err
	}
	argv := []string{spec.Path}
	if len(spec.Args) > 1 {
		argv = append(argv, spec.Args[1:]...)
	}
	dir := spec.Dir
	if dir == "" {
		dir = "/"
	}
	spec.Path, spec.Args, spec.Dir = t.bwrap, bwrapArgs(dir, seccompFD, argv), dir
	return spec, f, nil
}

// program returns a new anonymous file holding the seccomp program, positioned at its start: bwrap
// reads it from the shared file offset.
func (t *readonlyTools) program() (*os.File, error) {
	f, err := memfd("sbx-seccomp")
	if err != nil {
		return nil, fmt.Errorf("readonly: %w", err)
	}
	if _, err := f.Write(t.prog); err != nil {
		f.Close()
		return nil, fmt.Errorf("readonly: write seccomp program: %w", err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("readonly: rewind seccomp program: %w", err)
	}
	return f, nil
}

// memfd is an anonymous close-on-exec file.
func memfd(name string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}
