package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// probeArg is argv[1] of this binary run as the readonly probe (bwrap 0.8 cannot set argv[0]);
// MaybeInit recognises it.
const probeArg = "sbx-readonly-probe"

// probeOK is what the probe prints when every check passed.
const probeOK = "sbx-readonly-probe: ok"

// probeID is the probe's job id, a cgroup name under the Manager's root.
const probeID = "sbx-readonly-probe"

// probeLDDebug is the probe's LD_DEBUG: the loader then writes which libraries it loads, to a file
// under probeShm named by LD_DEBUG_OUTPUT.
const probeLDDebug = "libs"

// probeShm is where the probe's loader writes: a directory every sandbox has, writable, in its own
// /dev, and that a host outside has too.
const probeShm = "/dev/shm"

// probeTimeout bounds the probe; bwrap and a Go binary start in well under a second.
const probeTimeout = 20 * time.Second

// ProbeReadonly runs this binary as a readonly job, exactly as readonly jobs run (bwrap, the seccomp
// filter, the job's cgroup), and checks from inside that the sandbox holds (probeChecks: every rule
// of the filter, / and /proc/sys not writable, no nested user namespace), and from outside that the
// job's loader variables acted only inside (probeShm). It returns nil when
// readonly jobs can run here, else an error saying why not. A runner calls it once at start-up and
// keeps the verdict.
func (m *Manager) ProbeReadonly(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("readonly probe: find own binary: %w", err)
	}
	// The job's loader variables must act inside the sandbox only: the probe checks that it got
	// LD_DEBUG, and afterwards that no loader wrote its debug output on the host. Inside, /dev is
	// the sandbox's own tmpfs, which the loader can write; outside, it would be the host's /dev/shm.
	debugOut := filepath.Join(probeShm, fmt.Sprintf("%s-%d-%d", probeID, os.Getpid(), time.Now().UnixNano()))
	env := []string{"LD_DEBUG=" + probeLDDebug, "LD_DEBUG_OUTPUT=" + debugOut}
	p, err := m.Start(Spec{ID: probeID, Path: exe, Args: []string{exe, probeArg}, Dir: "/", Env: env, Readonly: true})
	if err != nil {
		return fmt.Errorf("readonly probe: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { _ = p.Kill() })
	defer stop()
	out, rerr := io.ReadAll(io.LimitReader(p.Output(), 4096))
	_, _ = io.Copy(io.Discard, p.Output()) // to EOF, which closes the pipe
	res, werr := p.Wait()
	msg := strings.TrimSpace(string(out))
	leaked, _ := filepath.Glob(debugOut + "*")
	for _, f := range leaked {
		_ = os.Remove(f)
	}
	switch {
	case len(leaked) > 0:
		return fmt.Errorf("readonly probe: the job's environment reached the loader outside the sandbox (LD_DEBUG wrote %s)", leaked[0])
	case ctx.Err() != nil:
		return fmt.Errorf("readonly probe: %w", ctx.Err())
	case rerr != nil:
		return fmt.Errorf("readonly probe: read output: %w", rerr)
	case werr != nil:
		return fmt.Errorf("readonly probe: %w", werr)
	case res.ExitCode != 0 || msg != probeOK:
		if msg == "" {
			msg = "no output"
		}
		return fmt.Errorf("readonly probe: exit code %d: %s", res.ExitCode, msg)
	}
	return nil
}

// probeCheck is one thing the probe tries: call must fail with want, or with any error when want
// is 0. Each call is harmless when the sandbox is broken and it succeeds: it creates nothing that
// outlives it, or removes what it created.
type probeCheck struct {
	what string
	want unix.Errno
	call func() error
}

// refused reports whether err, from c.call, is the refusal the check wants.
func (c probeCheck) refused(err error) bool {
	return err != nil && (c.want == 0 || errors.Is(err, c.want))
}

// probeChecks are the probe's checks, one or more for each rule of readonlyFilter and each bwrap
// flag that docs/readonly.md's "What it blocks" names a probe check for.
func probeChecks() []probeCheck {
	// rawErr and rawFD take a raw syscall's results; rawFD closes the descriptor a call made.
	rawErr := func(_, _ uintptr, errno unix.Errno) error {
		if errno != 0 {
			return errno
		}
		return nil
	}
	rawFD := func(r, _ uintptr, errno unix.Errno) error {
		if errno != 0 {
			return errno
		}
		unix.Close(int(r))
		return nil
	}
	socket := func(domain uintptr) func() error {
		return func() error {
			return rawFD(unix.RawSyscall(unix.SYS_SOCKET, domain, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0))
		}
	}
	// onRoot calls f with a read-only descriptor of /, which locks and leases need.
	onRoot := func(f func(fd int) error) func() error {
		return func() error {
			fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open /: %w", err)
			}
			defer unix.Close(fd)
			return f(fd)
		}
	}
	return []probeCheck{
		{"socket(AF_UNIX)", unix.EPERM, socket(unix.AF_UNIX)},
		{"socket(AF_UNIX|1<<32)", unix.EPERM, socket(unix.AF_UNIX | 1<<32)},
		{"socket(AF_VSOCK)", unix.EPERM, socket(unix.AF_VSOCK)},
		{"socket(AF_VSOCK|1<<32)", unix.EPERM, socket(unix.AF_VSOCK | 1<<32)},
		{"io_uring_setup", unix.EPERM, func() error {
			var params [120]byte // struct io_uring_params
			return rawFD(unix.RawSyscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params)), 0))
		}},
		// Without the filter: EINVAL, as a size of 0 is no struct clone_args; no child is made.
		{"clone3", unix.ENOSYS, func() error { return rawErr(unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)) }},
		{"keyctl", unix.EPERM, func() error {
			_, err := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_SESSION_KEYRING, 0, 0, 0)
			return err
		}},
		// A key type that does not exist: without the filter ENODEV, and no key is added.
		{"add_key", unix.EPERM, func() error {
			_, err := unix.AddKey("sbx-probe-none", "sbx-probe", nil, unix.KEY_SPEC_SESSION_KEYRING)
			return err
		}},
		{"request_key", unix.EPERM, func() error {
			_, err := unix.RequestKey("sbx-probe-none", "sbx-probe", "", 0)
			return err
		}},
		{"flock", unix.EPERM, onRoot(func(fd int) error { return unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB) })},
		// F_UNLCK takes no lease; on a directory, without the filter, it fails with EINVAL.
		{"fcntl(F_SETLEASE)", unix.EPERM, onRoot(func(fd int) error {
			_, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
			return err
		})},
		{"fcntl(F_SETLEASE|1<<32)", unix.EPERM, onRoot(func(fd int) error {
			return rawErr(unix.RawSyscall(unix.SYS_FCNTL, uintptr(fd), unix.F_SETLEASE|1<<32, unix.F_UNLCK))
		})},
		{"create /.sbx-readonly-probe", 0, func() error {
			f, err := os.OpenFile("/.sbx-readonly-probe", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err == nil {
				f.Close()
				_ = os.Remove(f.Name())
			}
			return err
		}},
		// Opened, never written.
		{"open /proc/sys/kernel/core_pattern for writing", 0, func() error {
			f, err := os.OpenFile("/proc/sys/kernel/core_pattern", os.O_WRONLY, 0)
			if err == nil {
				f.Close()
			}
			return err
		}},
		{"new user namespace", 0, probeUserns},
	}
}

// probeUserns tries to start a process in a new user namespace (unshare(2) would fail in any Go
// program: it is multithreaded). The program does not exist, so a child that was made fails to exec
// with ENOENT and nothing runs; a refused namespace fails the clone itself.
func probeUserns() error {
	p, err := os.StartProcess("/nonexistent/sbx-readonly-probe", []string{"sbx-readonly-probe"}, &os.ProcAttr{
		Sys: &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER},
	})
	if err == nil { // cannot happen; the namespace was made in any case
		_ = p.Kill()
		_, _ = p.Wait()
		return nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil // the namespace was made
	}
	return err
}

// probe runs inside the sandbox as the probe; it returns the exit code, 0 only when every check
// found the sandbox closed.
func probe(w io.Writer) int {
	var failed []string
	if v := os.Getenv("LD_DEBUG"); v != probeLDDebug {
		failed = append(failed, fmt.Sprintf("environment: LD_DEBUG is %q, want %q", v, probeLDDebug))
	}
	for _, c := range probeChecks() {
		switch err := c.call(); {
		case c.refused(err):
		case err == nil:
			failed = append(failed, fmt.Sprintf("%s: succeeded", c.what))
		default:
			failed = append(failed, fmt.Sprintf("%s: got %v, want %v", c.what, err, c.want))
		}
	}
	if len(failed) > 0 {
		fmt.Fprintln(w, "sbx-readonly-probe: "+strings.Join(failed, "; "))
		return 1
	}
	fmt.Fprintln(w, probeOK)
	return 0
}
