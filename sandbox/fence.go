package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A fence is a supervisor process per runner, as containerd's shim is per container: this binary
// re-executed as fenceArg0, in a process group of its own and with an empty environment, so that
// neither a signal to the runner's group nor the runner's secrets reach it. The runner renews it by
// writing a byte on its stdin after each heartbeat that NATS confirmed. When no renewal came for its
// time (the runner cut off from NATS, stopped by SIGSTOP, hung) or at once when its stdin reaches
// EOF (the runner died), it kills every process in the job cgroups under the runner's root and
// exits. It lives apart from the runner because a runner that is stopped cannot fence itself: its
// jobs' processes are not stopped with it.
//
// The fence reports on its stdout: '+' once it found the cgroups (or else the reason, as text, and it
// exits), then 'F' when it fires, before it kills. It writes what it killed, or failed to, to the
// stderr it shares with the runner.
const (
	// fenceArg0 is argv[0] of a fence; MaybeInit recognises it (the C constructor only "sbx-init").
	fenceArg0 = "sbx-fence"
	// fenceReady and fenceFired are the fence's reports.
	fenceReady = '+'
	fenceFired = 'F'
	// fenceStartTimeout bounds a fence's start-up: a Go runtime and one cgroup lookup.
	fenceStartTimeout = 10 * time.Second
	// renewTimeout bounds a renewal: a fence that does not read (stopped itself) must not stop the
	// runner's heartbeats once its pipe is full.
	renewTimeout = time.Second
)

// errFenceFired is Renew's error once the fence has fired: it kills or has killed the jobs and exits.
var errFenceFired = errors.New("sandbox: the fence fired")

// Fence is a running fence (see fenceArg0) over the job cgroups of one Manager.
type Fence struct {
	cmd    *exec.Cmd
	renew  *os.File // its stdin
	report *os.File // its stdout, non-blocking

	mu     sync.Mutex
	fired  bool
	closed bool
	err    error // the result of Close
}

// StartFence starts a fence that kills the processes of every job cgroup under m's root when it is
// not renewed for after, or when the Fence is closed or this process dies. It returns once the fence
// watches.
func (m *Manager) StartFence(after time.Duration) (*Fence, error) {
	if after <= 0 {
		return nil, fmt.Errorf("%w: fence after %s must be positive", ErrInvalidConfig, after)
	}
	renewR, renew, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("fence: %w", err)
	}
	defer renewR.Close()
	report, reportW, err := os.Pipe()
	if err != nil {
		renew.Close()
		return nil, fmt.Errorf("fence: %w", err)
	}
	defer reportW.Close()
	cmd := &exec.Cmd{
		Path:   "/proc/self/exe",
		Args:   []string{fenceArg0, after.String(), m.where.Version, m.where.Mountpoint, m.where.Root},
		Env:    []string{},
		Dir:    "/",
		Stdin:  renewR,
		Stdout: reportW,
		Stderr: os.Stderr,
		// A group of its own: a kill of the runner's group (^C, a service manager's) spares it.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	if err := cmd.Start(); err != nil {
		renew.Close()
		report.Close()
		return nil, fmt.Errorf("fence: %w", err)
	}
	f := &Fence{cmd: cmd, renew: renew, report: report}
	if err := f.ready(); err != nil {
		_ = cmd.Process.Kill() // one that hangs in its start-up would not see its stdin close
		f.Close()
		return nil, err
	}
	return f, nil
}

// ready waits for the fence's first report.
func (f *Fence) ready() error {
	if err := f.report.SetReadDeadline(time.Now().Add(fenceStartTimeout)); err != nil {
		return fmt.Errorf("fence: %w", err)
	}
	b := make([]byte, 1)
	if _, err := io.ReadFull(f.report, b); err != nil {
		return fmt.Errorf("fence: no report: %w", err)
	}
	if b[0] != fenceReady {
		rest, _ := io.ReadAll(f.report)
		return fmt.Errorf("fence: %s", append(b, rest...))
	}
	return f.report.SetReadDeadline(time.Time{})
}

// Renew restarts the fence's time. It fails once the fence fired or exited, or when it does not read
// its renewals (stopped, hung), which it then kills: the caller closes it and starts another.
func (f *Fence) Renew() error {
	if f.Fired() {
		return errFenceFired
	}
	err := f.renew.SetWriteDeadline(time.Now().Add(renewTimeout))
	if err == nil {
		_, err = f.renew.Write([]byte{1})
	}
	if err != nil {
		// It fences nothing, and Close must not wait for it. A fence that fired meanwhile does not
		// read any more either, but its pipe has room for hours of renewals: this write succeeded.
		_ = f.cmd.Process.Kill()
		return fmt.Errorf("renew fence: %w", err)
	}
	return nil
}

// Fired reports whether the fence fired. It is exact for a job whose processes died: the fence
// reports before it kills.
func (f *Fence) Fired() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fired || f.closed {
		return f.fired
	}
	rc, err := f.report.SyscallConn()
	if err != nil {
		return false
	}
	b := make([]byte, 1)
	// One read that does not wait: the report pipe is non-blocking.
	_ = rc.Read(func(fd uintptr) bool {
		n, _ := unix.Read(int(fd), b)
		f.fired = n == 1 && b[0] == fenceFired
		return true
	})
	return f.fired
}

// Close ends the fence: as at the runner's death, it kills what is left in the job cgroups, which is
// nothing once every job ended, and exits. Close waits for that; it reports a fence that failed to
// kill (its stderr says why).
func (f *Fence) Close() error {
	f.Fired() // the last word before the pipe closes
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return f.err
	}
	f.closed = true
	f.renew.Close()
	f.err = f.cmd.Wait()
	f.report.Close()
	if f.err != nil {
		f.err = fmt.Errorf("fence: %w", f.err)
	}
	return f.err
}

// fenceMain is the fence process, given os.Args[1:]; it returns the exit code.
func fenceMain(args []string) int {
	// Its reports must not kill it once the runner is gone: EPIPE instead of SIGPIPE.
	signal.Ignore(syscall.SIGPIPE)
	report := os.Stdout
	if len(args) != 4 {
		fmt.Fprintf(report, "malformed arguments %q", args)
		return 1
	}
	after, err := time.ParseDuration(args[0])
	if err != nil || after <= 0 {
		fmt.Fprintf(report, "malformed time %q", args[0])
		return 1
	}
	// Warm < 0: no warm init steps of its own.
	m, err := NewManager(Config{Version: args[1], Mountpoint: args[2], Root: args[3], Warm: -1})
	if err != nil {
		fmt.Fprint(report, err)
		return 1
	}
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		b := make([]byte, 64)
		for {
			n, err := os.Stdin.Read(b)
			if n > 0 {
				renewed <- struct{}{}
			}
			if err != nil {
				return // EOF: the runner closed it or died
			}
		}
	}()
	_, _ = report.Write([]byte{fenceReady})
	t := time.NewTimer(after)
	for {
		select {
		case _, ok := <-renewed:
			if ok {
				t.Reset(after)
				continue
			}
			return fenceKill(m, "its runner is gone")
		case <-t.C:
			_, _ = report.Write([]byte{fenceFired})
			return fenceKill(m, fmt.Sprintf("no renewal from its runner for %s", after))
		}
	}
}

// fenceKill kills the processes of every job cgroup under m's root, without removing the cgroups:
// they are the runner's, or its next life's, to remove.
func fenceKill(m *Manager, why string) int {
	n, err := m.sweep(false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sbx-fence %s: %s: killing the jobs: %v\n", m.where.Root, why, err)
		return 1
	}
	if n > 0 {
		fmt.Fprintf(os.Stderr, "sbx-fence %s: %s: killed the processes of %d cgroups\n", m.where.Root, why, n)
	}
	return 0
}
