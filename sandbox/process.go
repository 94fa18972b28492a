package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Result is how a job ended and what it used.
type Result struct {
	// ExitCode follows the shell: a death by signal is 128+signo.
	ExitCode int
	// Signal is the signal that killed the main process; 0 when it exited.
	Signal int
	// OOMKilled is true when the OOM killer acted in the job's cgroup.
	OOMKilled bool
	// CPU is the CPU time of every process in the cgroup.
	CPU time.Duration
	// MemoryPeak is the cgroup's peak memory in bytes; 0 where the kernel does not track it
	// (v2 before Linux 5.19, or without the memory controller).
	MemoryPeak uint64
}

// Process is a started job.
//
// One goroutine, locked to its OS thread, starts the main process and waits for it: Pdeathsig fires
// when the thread that forked the child exits, so that thread must live exactly as long as the child.
type Process struct {
	pid   int
	g     group
	grace time.Duration
	out   *output
	errs  *output  // standard error's own pipe (Spec.SeparateStderr); nil when it shares out
	in    *os.File // the write end of the job's stdin (Spec.Stdin), or its terminal's master (Spec.TTY); nil when it reads /dev/null
	// tty: the job runs on a terminal (Spec.TTY), in is its master; readonly: inside bwrap.
	tty, readonly bool
	// hasInput: the job has an input (a pipe or a terminal), input is that file's identity, which
	// Activity looks for among the files its processes read; supervisor is the absolute path of a
	// readonly job's bwrap, whose processes only wait for the command.
	hasInput   bool
	input      fileID
	supervisor string

	done   chan struct{} // closed when result and err are set and the cgroup is gone
	result Result
	err    error

	// release is called once the job is over (the Manager forgets its id). A warm init step's g and
	// release change when a job claims it; both are read and written under mu.
	release func()

	mu      sync.Mutex
	exited  bool           // the main process is reaped: its pid may be reused, never signal it
	killing bool           // Kill has started escalate
	killAt  time.Time      // when a kill's grace ends and everything left gets SIGKILL
	kicked  chan struct{}  // closed by the first Kill
	escal   sync.WaitGroup // escalate, which Wait waits for
	// linger keeps the job after its main process exits, until its output closes (Spec.Linger);
	// lingerCgroup until its cgroup is empty (Spec.LingerCgroup).
	linger, lingerCgroup bool

	// killMu serialises cgroup kills between escalate and the finishing goroutine.
	killMu sync.Mutex
}

// start launches spec's command inside g with files as its descriptors from 3 on; release is called
// once the job is over. prepare makes the command start inside g (g.prepare, or the warm pool's).
func start(g group, spec Spec, files []*os.File, grace time.Duration, release func(), prepare func(*exec.Cmd) (func(error) error, error)) (*Process, error) {
	fail := func(err error) (*Process, error) {
		release()
		return nil, errors.Join(err, g.remove())
	}
	var term *terminal
	var r, w *os.File
	var err error
	if spec.TTY {
		// The terminal is the output: r its master, w the slave the child gets.
		if term, err = openTerminal(spec.TTYSize); err != nil {
			return fail(err)
		}
		r, w = term.master, term.slave
	} else if r, w, err = os.Pipe(); err != nil {
		return fail(fmt.Errorf("output pipe: %w", err))
	}
	args := spec.Args
	if len(args) == 0 {
		args = []string{spec.Path}
	}
	env := spec.Env
	if env == nil {
		env = []string{} // nil would make os/exec inherit the runner's environment
	}
	dir := spec.Dir
	if dir == "" {
		dir = "/"
	}
	// The parent's ends the child gets: closed once it has started, so that EOF means what it says.
	childEnds := []*os.File{w}
	// parentEnds are the parent's own ends, closed when the start fails.
	parentEnds := []*os.File{r}
	closeAll := func() {
		for _, f := range append(childEnds, parentEnds...) {
			f.Close()
		}
	}
	stderr := w // one *os.File for both: the child gets the same pipe on fd 1 and 2, order kept
	var errs *output
	if spec.SeparateStderr {
		er, ew, err := os.Pipe()
		if err != nil {
			closeAll()
			return fail(fmt.Errorf("error pipe: %w", err))
		}
		stderr, errs = ew, &output{f: er, closed: make(chan struct{})}
		childEnds, parentEnds = append(childEnds, ew), append(parentEnds, er)
	}
	cmd := &exec.Cmd{
		Path:       spec.Path,
		Args:       args,
		Env:        env,
		Dir:        dir,
		Stdout:     w,
		Stderr:     stderr,
		ExtraFiles: files,
		SysProcAttr: &syscall.SysProcAttr{
			Setpgid:   true,
			Pdeathsig: syscall.SIGKILL,
		},
	}
	if spec.Readonly {
		// bwrap makes its mounts slaves of the namespace it starts in, so a mount made on the host
		// under a shared mount while the job runs would appear in the sandbox, writable. A private
		// namespace of its own (Go remounts / rprivate in the child) receives nothing from the host.
		cmd.SysProcAttr.Unshareflags = syscall.CLONE_NEWNS
	}
	if c := spec.Credential; c != nil {
		// v1's prepare moves it into the init step, which drops to it after joining the cgroup.
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: c.Groups}
	}
	var in *os.File
	if term != nil {
		term.attach(cmd)
		in = term.input
		parentEnds = append(parentEnds, in)
	} else if spec.Stdin {
		inR, inW, err := os.Pipe()
		if err != nil {
			closeAll()
			return fail(fmt.Errorf("input pipe: %w", err))
		}
		cmd.Stdin, in = inR, inW
		childEnds, parentEnds = append(childEnds, inR), append(parentEnds, inW)
	}
	var inputID fileID
	if in != nil {
		if inputID, err = fstatID(in); err != nil {
			closeAll()
			return fail(err)
		}
		if term != nil {
			// A terminal's two sides are two files: the processes read the slave.
			if inputID, err = fstatID(term.slave); err != nil {
				closeAll()
				return fail(err)
			}
		}
	}
	started, err := prepare(cmd)
	if err != nil {
		closeAll()
		return fail(err)
	}
	p := &Process{
		g: g, grace: grace, out: &output{f: r, closed: make(chan struct{}), tty: term != nil}, errs: errs, in: in, done: make(chan struct{}),
		tty: term != nil, readonly: spec.Readonly, hasInput: in != nil, input: inputID,
		kicked: make(chan struct{}), release: release, linger: spec.Linger, lingerCgroup: spec.LingerCgroup,
	}
	if spec.Readonly {
		p.supervisor = spec.Path // Manager.Start made it bwrap
	}
	startErr := make(chan error, 1)
	go p.run(cmd, childEnds, started, startErr)
	if err := <-startErr; err != nil {
		for _, f := range parentEnds { // run closed the child's
			f.Close()
		}
		return fail(err)
	}
	return p, nil
}

// run is the goroutine that owns the main process: it starts it on a locked thread, reports the
// start on startErr, then waits for it and finishes the job.
func (p *Process) run(cmd *exec.Cmd, childEnds []*os.File, started func(error) error, startErr chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err := started(cmd.Start())
	// The parent's copies of the child's ends go now: the output's write end so that EOF arrives once
	// every process in the cgroup is dead, the input's read end so that a closed input is EOF.
	for _, f := range childEnds {
		f.Close()
	}
	if err != nil {
		if cmd.Process != nil {
			// The v1 init step failed to join or exec and is exiting; the kill only makes sure.
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		startErr <- err
		return
	}
	p.pid = cmd.Process.Pid
	startErr <- nil

	werr := cmd.Wait()
	p.mu.Lock()
	p.exited = true
	g, release := p.g, p.release
	p.mu.Unlock()
	p.result, p.err = p.finish(g, cmd.ProcessState, werr)
	if p.in != nil {
		p.in.Close() // nothing is left to read it
	}
	release()
	close(p.done)
}

// finish ends the job after its main process: whatever is left in the cgroup is killed (a job ends
// when its shell ends), then the usage is read and the cgroup removed. A lingering job first waits
// until its output closes or it is killed; a job being killed first lets what is left use the rest
// of the kill's grace, so that a child's SIGTERM handler is not cut off when the shell dies first.
func (p *Process) finish(g group, state *os.ProcessState, werr error) (Result, error) {
	var res Result
	var errs []error
	// An *exec.ExitError only says the job failed, which res reports.
	var ee *exec.ExitError
	if werr != nil && !errors.As(werr, &ee) {
		errs = append(errs, fmt.Errorf("wait: %w", werr))
	}
	if state != nil {
		ws := state.Sys().(syscall.WaitStatus)
		res.ExitCode = ws.ExitStatus()
		if ws.Signaled() {
			res.Signal = int(ws.Signal())
			res.ExitCode = 128 + res.Signal
		}
	}
	p.mu.Lock()
	linger, lingerCgroup := p.linger, p.lingerCgroup
	p.mu.Unlock()
	if lingerCgroup {
		waitEmptyOrKicked(g.pids, p.kicked)
	}
	if linger || lingerCgroup {
		for _, o := range []*output{p.out, p.errs} {
			if o == nil {
				continue
			}
			select {
			case <-o.closed:
			case <-p.kicked:
			}
		}
	}
	p.mu.Lock()
	killing, killAt := p.killing, p.killAt
	p.mu.Unlock()
	if killing {
		waitEmptyUntil(g.pids, killAt)
	}
	p.killMu.Lock()
	kerr := g.kill()
	p.killMu.Unlock()
	if kerr != nil {
		errs = append(errs, fmt.Errorf("kill leftovers: %w", kerr))
	}
	u, err := g.usage()
	if err != nil {
		errs = append(errs, fmt.Errorf("read usage: %w", err))
	}
	res.OOMKilled, res.CPU, res.MemoryPeak = u.oomKilled, u.cpu, u.memoryPeak
	if err := g.remove(); err != nil {
		errs = append(errs, err)
	}
	return res, errors.Join(errs...)
}

// Pid is the main process's pid, which is also its process group id.
func (p *Process) Pid() int { return p.pid }

// Input is the write end of the job's standard input when Spec.Stdin asked for one, the master of
// its terminal with Spec.TTY (what is written is typed: closing it does not hang the terminal up,
// write the terminal's EOF character, ^D, instead), else nil. A pipe's reader sees EOF when it is
// closed; it is closed when the job is over. Writes block while the job does
// not read (it has SetWriteDeadline, as *os.File does).
func (p *Process) Input() *os.File { return p.in }

// Output is one pipe carrying stdout and stderr interleaved in the order written (stdout alone with
// Spec.SeparateStderr). Nothing is buffered inside sandbox: a job blocks on write while the caller does not read, so read it
// concurrently with Wait and, after Wait returns, until EOF. EOF arrives once every process in the
// cgroup is dead, which Wait ensures; the pipe is closed at EOF. Read it from one goroutine.
//
// The reader also has SetReadDeadline(time.Time) error, as *os.File does: a Read past the deadline
// returns an error matching os.ErrDeadlineExceeded and consumes nothing, so a caller can gather
// small writes into one chunk for a while and then send what it has.
func (p *Process) Output() io.Reader { return p.out }

// Errors is standard error's own pipe when Spec.SeparateStderr asked for one, else nil (it shares
// Output). It behaves as Output does, and must be read to EOF as well, from a goroutine of its own.
func (p *Process) Errors() io.Reader {
	if p.errs == nil {
		return nil
	}
	return p.errs
}

// Signal sends sig to the job's process group. Once the main process has exited it returns
// os.ErrProcessDone: the group id may then belong to someone else.
func (p *Process) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return os.ErrProcessDone
	}
	if err := unix.Kill(-p.pid, sig); err != nil {
		return fmt.Errorf("signal %s: %w", sig, err)
	}
	return nil
}

// Kill sends SIGTERM to the job and returns: to the main process's group and to every other process
// in the cgroup (a child in its own session, a readonly command inside bwrap). When KillGrace has
// passed, whatever is left in the cgroup is killed, so setsid'd and daemonised descendants die too;
// the grace covers the whole job, also when the main process exits before it. Kill is safe to call
// more than once and concurrently with Wait; after the job is over it does nothing.
func (p *Process) Kill() error {
	p.mu.Lock()
	if !p.killing {
		p.killing = true
		p.killAt = time.Now().Add(p.grace)
		close(p.kicked)
		p.escal.Add(1)
		go p.escalate()
	}
	g := p.g
	p.mu.Unlock()
	select {
	case <-p.done:
		return nil
	default:
	}
	// Each process once, whatever its group; the group alone is what is left if listing fails.
	serr := g.signal(unix.SIGTERM)
	if serr == nil || removed(serr) {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.exited {
		if err := unix.Kill(-p.pid, unix.SIGTERM); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("kill: %w", errors.Join(serr, err))
		}
	}
	return fmt.Errorf("kill: %w", serr)
}

// escalate is Kill's second stage, run once per Process and waited for by Wait: at the end of the
// grace, a main process still running gets SIGKILL with its group and everything in the cgroup. Once
// the main process has exited, finish does that at the same moment instead.
func (p *Process) escalate() {
	defer p.escal.Done()
	t := time.NewTimer(p.grace)
	defer t.Stop()
	select {
	case <-p.done:
		return
	case <-t.C:
	}
	p.mu.Lock()
	if p.exited {
		p.mu.Unlock()
		return
	}
	// ESRCH: the main process left its group (setsid); the cgroup kill below still reaches it.
	_ = unix.Kill(-p.pid, unix.SIGKILL)
	g := p.g
	p.mu.Unlock()
	p.killMu.Lock()
	defer p.killMu.Unlock()
	// An error here leaves processes that finish's own kill, after the main process dies, meets
	// again and reports through Wait.
	_ = g.kill()
}

// Wait waits for the main process to exit, kills whatever is left in the cgroup, reads the usage and
// removes the cgroup. It does not wait for Output to reach EOF. The error reports a failure to clean
// up, not a failed job; the Result is valid either way. Calling Wait again returns the same.
func (p *Process) Wait() (Result, error) {
	<-p.done
	p.escal.Wait()
	return p.result, p.err
}

// output is the read end of the job's pipe; it closes itself at EOF, which the caller is told to
// read to, so that the descriptor does not outlive the job.
type output struct {
	f      *os.File
	tty    bool // f is a terminal's master, which reads EIO once no process holds the slave
	eof    bool
	closed chan struct{} // closed at EOF: every process has closed the pipe
}

// SetReadDeadline sets the deadline for pending and future Reads; the zero time clears it. After EOF
// the pipe is closed and it returns an error matching os.ErrClosed.
func (o *output) SetReadDeadline(t time.Time) error { return o.f.SetReadDeadline(t) }

func (o *output) Read(b []byte) (int, error) {
	if o.eof {
		return 0, io.EOF
	}
	n, err := o.f.Read(b)
	if o.tty && errors.Is(err, syscall.EIO) {
		err = io.EOF
	}
	if err == io.EOF {
		o.eof = true
		o.f.Close()
		close(o.closed)
	}
	return n, err
}
