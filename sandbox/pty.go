package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"

	"golang.org/x/sys/unix"
)

// TTYSize is a terminal's size in character cells; zero fields take 24 rows and 80 columns.
type TTYSize struct {
	Rows, Cols uint16
}

func (s TTYSize) winsize() *unix.Winsize {
	ws := &unix.Winsize{Row: s.Rows, Col: s.Cols}
	if ws.Row == 0 {
		ws.Row = 24
	}
	if ws.Col == 0 {
		ws.Col = 80
	}
	return ws
}

// terminal is a job's pseudo-terminal: the runner's side (master) and the job's (slave).
type terminal struct {
	// master is what the job writes, read as its output; the slave end's last close reads as EOF.
	master *os.File
	// input is a second descriptor of the master, what is typed: it lives until the job is over,
	// while master closes at EOF, and it is the one resizes go through.
	input *os.File
	// slave is the child's stdin, stdout and stderr; the parent closes it once the child started.
	slave *os.File
}

// openTerminal opens a new pseudo-terminal pair of the given size. The master's descriptors are
// non-blocking, so that reads and writes honour deadlines.
func openTerminal(size TTYSize) (*terminal, error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	master := os.NewFile(uintptr(fd), "/dev/ptmx")
	t := &terminal{master: master}
	fail := func(err error) (*terminal, error) {
		t.close()
		return nil, err
	}
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		return fail(fmt.Errorf("unlock pty: %w", err))
	}
	if err := unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, size.winsize()); err != nil {
		return fail(fmt.Errorf("set pty size: %w", err))
	}
	slave, err := openPeer(fd)
	if err != nil {
		return fail(err)
	}
	t.slave = slave
	in, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fail(fmt.Errorf("dup pty: %w", err))
	}
	t.input = os.NewFile(uintptr(in), "/dev/ptmx")
	return t, nil
}

// openPeer opens the slave of master: by TIOCGPTPEER (Linux 4.13), which needs no path and so
// cannot be raced to another device, else by its /dev/pts name.
func openPeer(master int) (*os.File, error) {
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(master), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno == 0 {
		return os.NewFile(fd, "/dev/pts"), nil
	}
	n, err := unix.IoctlGetInt(master, unix.TIOCGPTN)
	if err != nil {
		return nil, fmt.Errorf("pty number: %w", err)
	}
	name := "/dev/pts/" + strconv.Itoa(n)
	f, err := os.OpenFile(name, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("open pty: %w", err)
	}
	return f, nil
}

// attach makes the slave the init step's standard input, output and error, which it passes on to
// the job's program. The init stays in the group Start gave it, outside any session of the
// terminal's; its child (jobMessage's tty field) starts a session of its own with the terminal as
// its controlling terminal: the kernel then sends SIGWINCH on a resize and SIGHUP when the terminal
// goes. The session leader is its own process group leader, which Process.Signal relies on.
func (t *terminal) attach(cmd *exec.Cmd) {
	cmd.Stdin, cmd.Stdout, cmd.Stderr = t.slave, t.slave, t.slave
}

func (t *terminal) close() {
	for _, f := range []*os.File{t.master, t.input, t.slave} {
		if f != nil {
			f.Close()
		}
	}
}

// ErrNoTerminal is returned by Resize for a job that has no terminal.
var ErrNoTerminal = errors.New("sandbox: the job has no terminal")

// Resize sets the size of the job's terminal; the kernel sends SIGWINCH to its foreground process
// group. A readonly job's command runs in a session of bwrap's own (--new-session), which the
// terminal's signal does not reach, so its processes get SIGWINCH from here as well (its default
// action is to do nothing). After the job is over it returns os.ErrClosed.
func (p *Process) Resize(size TTYSize) error {
	if !p.tty {
		return ErrNoTerminal
	}
	rc, err := p.in.SyscallConn()
	if err != nil {
		return fmt.Errorf("resize: %w", err)
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, size.winsize())
	}); err != nil {
		return fmt.Errorf("resize: %w", err)
	}
	if ierr != nil {
		return fmt.Errorf("resize: %w", ierr)
	}
	if p.readonly {
		p.mu.Lock()
		g := p.g
		p.mu.Unlock()
		if err := g.signal(unix.SIGWINCH); err != nil && !removed(err) {
			return fmt.Errorf("resize: %w", err)
		}
	}
	return nil
}
