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
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// seccompFD is the descriptor on which a readonly job's bwrap reads its seccomp program. Descriptor 3
// is the init step's status pipe (statusFD), so the program is on 4.
const seccompFD = statusFD + 1

// argsFD is the descriptor on which a readonly job's bwrap reads the job's environment, as --setenv
// options (--args; bwrapEnv). Descriptor 5 is the init step's job (jobFD).
const argsFD = jobFD + 1

// bwrapEnviron is bwrap's own environment: empty. bwrap runs outside the sandbox, as the runner's
// user with every capability until it drops them, and its dynamic loader and libc read their
// variables (LD_PRELOAD, LD_DEBUG_OUTPUT, GCONV_PATH, GLIBC_TUNABLES…) before any namespace exists;
// the job's variables reach the job through --setenv instead, which bwrap applies after it has been
// loaded (bwrap loads no library and runs no other program later). bwrap needs none: the program it
// runs is an absolute path.
var bwrapEnviron = []string{}

// bwrapArgs is the argv of bwrap running argv (argv[0] an absolute path) in dir with nothing writable,
// no network, no capabilities, a private /proc and /dev, the hidden paths covered, the seccomp
// program read from fd, and the job's environment read from envFD (bwrapEnv). The flags are DESIGN.md's ("Runner: readonly") and more; docs/readonly.md says
// what each blocks:
//   - --unshare-user --disable-userns: the job cannot make a user namespace of its own, in which it
//     would hold every capability again and could mount its cgroup and lift its limits;
//   - --ro-bind /proc/sys /proc/sys: bwrap covers /proc/sys only when access(2) says it is writable,
//     and for the directory it never does, so as root every sysctl stayed writable.
func bwrapArgs(dir string, fd, envFD int, hide []hidden, argv []string) []string {
	args := []string{
		"bwrap",
		// First: bwrap's own arguments are on its command line, which every user of the host can
		// read (ps), and the environment may hold secrets; a file keeps it out of sight.
		"--args", strconv.Itoa(envFD),
		"--new-session",
		"--die-with-parent",
		"--unshare-all",
		"--unshare-user",
		"--disable-userns",
		"--ro-bind", "/", "/",
		"--dev", "/dev",
		"--proc", "/proc",
		"--ro-bind", "/proc/sys", "/proc/sys",
	}
	// Last among the mounts, so that nothing mounted after covers a hidden path again.
	for _, h := range hide {
		if h.dir {
			args = append(args, "--tmpfs", h.path, "--remount-ro", h.path)
		} else {
			args = append(args, "--ro-bind", "/dev/null", h.path)
		}
	}
	args = append(args,
		"--cap-drop", "ALL",
		"--chdir", dir,
		"--seccomp", strconv.Itoa(fd),
		"--",
	)
	return append(args, argv...)
}

// bwrapEnv is the content of bwrap's --args file that gives the job env (KEY=VALUE entries): one
// --setenv KEY VALUE per entry, NUL-terminated, in order (a later entry overrides an earlier one, as
// in execve's). An entry without "=" is no variable and is left out. Loader variables (LD_PRELOAD…)
// are passed like any other: bwrap sets them after its own start, so only the job's loader, inside
// the sandbox, reads them.
func bwrapEnv(env []string) []byte {
	var b []byte
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		for _, s := range []string{"--setenv", k, v} {
			b = append(append(b, s...), 0)
		}
	}
	return b
}

// hidden is a path a readonly job must not see, as found when the job starts.
type hidden struct {
	path string // absolute, without symlinks
	dir  bool   // covered by an empty read-only tmpfs; else by /dev/null
}

// findHidden resolves paths (Config.Hide) for one job run as cred (nil: the runner's own user): a
// path that does not exist is skipped, a symlink is followed (bwrap would mount on its target
// anyway, and the target is what must be covered), and a path under a hidden directory is left out,
// as it is covered already (and bwrap could not make its mount point in the read-only tmpfs). A path
// in a directory cred cannot search is skipped too: the job cannot reach it, and bwrap, running as
// cred, could not make its mount point there.
func findHidden(paths []string, cred *Credential) ([]hidden, error) {
	var hs []hidden
	for _, p := range paths {
		resolved, err := filepath.EvalSymlinks(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("hide %s: %w", p, err)
		}
		if resolved == "/" {
			return nil, fmt.Errorf("hide %s: resolves to /", p)
		}
		if !searchable(filepath.Dir(resolved), cred) {
			continue
		}
		fi, err := os.Stat(resolved)
		if err != nil {
			return nil, fmt.Errorf("hide %s: %w", p, err)
		}
		hs = append(hs, hidden{path: resolved, dir: fi.IsDir()})
	}
	// Parents sort before their children.
	slices.SortFunc(hs, func(a, b hidden) int { return strings.Compare(a.path, b.path) })
	out := hs[:0]
	for _, h := range hs {
		covered := false
		for _, o := range out {
			if h.path == o.path || o.dir && strings.HasPrefix(h.path, o.path+"/") {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, h)
		}
	}
	return out, nil
}

// searchable reports whether cred may search dir and every directory above it, by the mode bits
// (nil cred: yes, bwrap then runs as the runner's own user, root).
func searchable(dir string, cred *Credential) bool {
	if cred == nil {
		return true
	}
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return false
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return true
		}
		mode := fi.Mode().Perm()
		var x fs.FileMode
		switch {
		case st.Uid == cred.UID:
			x = mode & 0o100
		case st.Gid == cred.GID || slices.Contains(cred.Groups, st.Gid):
			x = mode & 0o010
		default:
			x = mode & 0o001
		}
		if x == 0 {
			return false
		}
		if d == "/" {
			return true
		}
	}
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

// wrap turns spec into bwrap running spec's program with hide (Config.Hide) covered and bwrap's own
// environment fixed (bwrapEnviron), and returns the --args content that gives the program spec's
// environment, which bwrap must find on argsFD (bwrapEnv).
func (t *readonlyTools) wrap(spec Spec, hide []string) (Spec, []byte, error) {
	hs, err := findHidden(hide, spec.Credential)
	if err != nil {
		return Spec{}, nil, fmt.Errorf("readonly: %w", err)
	}
	argv := []string{spec.Path}
	if len(spec.Args) > 1 {
		argv = append(argv, spec.Args[1:]...)
	}
	dir := spec.Dir
	if dir == "" {
		dir = "/"
	}
	env := bwrapEnv(spec.Env)
	spec.Path, spec.Args, spec.Dir, spec.Env = t.bwrap, bwrapArgs(dir, seccompFD, argsFD, hs, argv), dir, bwrapEnviron
	return spec, env, nil
}

// memfdWith returns a new anonymous file holding data, positioned at its start, which bwrap and the
// init step read from the shared offset.
func memfdWith(name string, data []byte) (*os.File, error) {
	f, err := memfd(name)
	if err != nil {
		return nil, err
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("write %s: %w", name, err)
	}
	return f, nil
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
