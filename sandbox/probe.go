package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
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

// probeTimeout bounds the probe; bwrap and a Go binary start in well under a second.
const probeTimeout = 20 * time.Second

// ProbeReadonly runs this binary as a readonly job, exactly as readonly jobs run (bwrap, the seccomp
// filter, the job's cgroup), and checks from inside that the sandbox holds: an AF_UNIX socket is
// refused with EPERM (also with junk in the domain's high 32 bits), io_uring is refused, and / is not
// writable. It returns nil when readonly jobs can run here, else an error saying why not. A runner
// calls it once at start-up and keeps the verdict.
func (m *Manager) ProbeReadonly(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("readonly probe: find own binary: %w", err)
	}
	p, err := m.Start(Spec{ID: probeID, Path: exe, Args: []string{exe, probeArg}, Dir: "/", Env: []string{}, Readonly: true})
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
	switch {
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

// probe runs inside the sandbox as the probe; it returns the exit code, 0 only when every check
// found the sandbox closed.
func probe(w io.Writer) int {
	var failed []string
	check := func(what string, err error) {
		if !errors.Is(err, unix.EPERM) {
			failed = append(failed, fmt.Sprintf("%s: got %v, want EPERM", what, errOrNil(err)))
		}
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	closeIfOpen(int(fd), err)
	check("socket(AF_UNIX)", err)
	r, _, errno := unix.RawSyscall(unix.SYS_SOCKET, unix.AF_UNIX|1<<32, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	closeIfOpen(int(r), errnoErr(errno))
	check("socket(AF_UNIX|1<<32)", errnoErr(errno))
	var params [120]byte // struct io_uring_params
	r, _, errno = unix.RawSyscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params)), 0)
	closeIfOpen(int(r), errnoErr(errno))
	check("io_uring_setup", errnoErr(errno))
	if f, err := os.OpenFile("/.sbx-readonly-probe", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
		f.Close()
		_ = os.Remove(f.Name())
		failed = append(failed, "/ is writable")
	}
	if len(failed) > 0 {
		fmt.Fprintln(w, "sbx-readonly-probe: "+strings.Join(failed, "; "))
		return 1
	}
	fmt.Fprintln(w, probeOK)
	return 0
}

// errnoErr is a raw syscall's errno as an error, nil for none.
func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// errOrNil names a call's outcome for the probe's report.
func errOrNil(err error) any {
	if err == nil {
		return "success"
	}
	return err
}

// closeIfOpen closes what a call that should have failed opened.
func closeIfOpen(fd int, err error) {
	if err == nil && fd >= 0 {
		unix.Close(fd)
	}
}
