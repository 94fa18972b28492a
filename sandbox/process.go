package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
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

// Process is a started job: the init step (init.go), pid 1 of the job's pid namespace, and the
// job's program, its child.
//
// A spawner (spawn) forks the init step; then one ordinary goroutine follows it: it reads the init's
// status pipe and waits for it.
type Process struct {
	jobPid int // the job's program's pid on the host, also its process group id; set once launched
	g      group
	grace  time.Duration
	out    *output
	errs   *output  // standard error's own pipe (Spec.SeparateStderr); nil when it shares out
	in     *os.File // the write end of the job's stdin (Spec.Stdin), or its terminal's master (Spec.TTY); nil when it reads /dev/null
	// tty: the job runs on a terminal (Spec.TTY), in is its master; readonly: inside bwrap.
	tty, readonly bool
	// hasInput: the job has an input (a pipe or a terminal), input is that file's identity, which
	// Activity looks for among the files its processes read; supervisor is the absolute path of a
	// readonly job's bwrap, whose processes only wait for the command.
	hasInput   bool
	input      fileID
	supervisor string

	// joined receives the init step's report that it joined its cgroups, launched that it ran the
	// job's program (nil, jobPid set) or why not; each exactly once, in that order, or an error on
	// both when the init ended first.
	joined, launched chan error

	ended  chan struct{} // closed when result is set: the job is over, its cgroup maybe not gone yet
	done   chan struct{} // closed when err is set too and the cgroup is gone
	result Result
	err    error

	// release is called once the job is over (the Manager forgets its id). A warm init step's g and
	// release change when a job claims it; both are read and written under mu.
	release func()

	mu      sync.Mutex
	stages  Stages         // set as the init step reports them
	exited  bool           // the job's program has exited: its pid may be reused, never signal it
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

// start launches the init step inside g with files as its descriptors from 4 on (the init's job on
// jobFD among them, which the init reads to EOF) and returns once it has joined g; release is called
// once the job is over. prepare makes the init start inside g (g.prepare). The caller then waits on
// p.launched for the job's program to run; a Process whose program never ran ends by itself, and
// Wait returns once it has.
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
	sr, sw, err := os.Pipe()
	if err != nil {
		r.Close()
		w.Close()
		return fail(fmt.Errorf("status pipe: %w", err))
	}
	// The parent's ends the child gets: closed once it has started, so that EOF means what it says.
	childEnds := []*os.File{w, sw}
	// parentEnds are the parent's own ends, closed when the start fails.
	parentEnds := []*os.File{r, sr}
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
		Path: "/proc/self/exe",
		Args: []string{initArg0},
		// Nothing of the job's: the init runs outside the job, as the runner, and its dynamic loader
		// reads the environment before anything else (docs/readonly.md, "The job's environment").
		Env:        []string{},
		Dir:        "/",
		Stdout:     w,
		Stderr:     stderr,
		ExtraFiles: append([]*os.File{sw}, files...),
		SysProcAttr: &syscall.SysProcAttr{
			Setpgid:   true,
			Pdeathsig: syscall.SIGKILL,
			// The job's own pid namespace, whose pid 1 the init is, and a mount namespace for its
			// /proc (the init makes every mount private first).
			Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
		},
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
		g: g, grace: grace, out: &output{f: r, closed: make(chan struct{}), tty: term != nil}, errs: errs, in: in, ended: make(chan struct{}), done: make(chan struct{}),
		tty: term != nil, readonly: spec.Readonly, hasInput: in != nil, input: inputID,
		kicked: make(chan struct{}), release: release, linger: spec.Linger, lingerCgroup: spec.LingerCgroup,
		joined: make(chan error, 1), launched: make(chan error, 1),
	}
	if spec.Readonly {
		p.supervisor = spec.Path // Manager.Start made it bwrap
	}
	startErr := make(chan error, 1)
	go p.run(cmd, childEnds, started, sr, startErr)
	if err := <-startErr; err != nil {
		for _, f := range parentEnds { // run closed the child's and the status pipe
			f.Close()
		}
		return fail(err)
	}
	if err := <-p.joined; err != nil {
		p.Wait() // the Process has removed the cgroup and released the id
		return nil, err
	}
	return p, nil
}

// spawners is how many goroutines fork init steps: Go forks one child at a time (syscall.ForkLock),
// but each spawner then waits until its child has executed the init step, about a millisecond.
const spawners = 8

// spawnRequest is a command for a spawner to start, and where it says how that went.
type spawnRequest struct {
	cmd  *exec.Cmd
	done chan<- error
}

var (
	spawnOnce sync.Once
	spawnReqs chan spawnRequest
)

// spawn starts cmd on one of the spawners: goroutines locked to their OS threads that never return.
// The init step's parent-death signal (Pdeathsig) fires when the thread that forked it exits, not
// the process; the Go runtime ends a thread when a goroutine returns while locked to it, which any
// goroutine on that thread may do later. A spawner's thread lives as long as the process, so a job
// still dies with the runner and at no other time. They are the process's, not a Manager's: jobs
// outlive their Manager's Close. Waiting for the child needs no particular thread: wait4 reaps a
// child of any thread of the process. (Each job once held a thread of its own, locked for its whole
// life: 10,000 sleeping jobs were 10,000 threads.)
func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnReqs = make(chan spawnRequest)
		for range spawners {
			go func() {
				runtime.LockOSThread() // for good: see above
				for r := range spawnReqs {
					r.done <- r.cmd.Start()
				}
			}()
		}
	})
	done := make(chan error, 1)
	spawnReqs <- spawnRequest{cmd, done}
	return <-done
}

// run is the goroutine that owns the init step: it starts it (spawn), reports the start on
// startErr, follows its status pipe (status) and waits for it, then finishes the job.
func (p *Process) run(cmd *exec.Cmd, childEnds []*os.File, started func(error) error, status *os.File, startErr chan<- error) {
	err := started(spawn(cmd))
	// The parent's copies of the child's ends go now: the output's write end so that EOF arrives once
	// every process in the cgroup is dead, the input's read end so that a closed input is EOF.
	for _, f := range childEnds {
		f.Close()
	}
	if err != nil {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		status.Close()
		startErr <- err
		return
	}
	startErr <- nil
	// os.Process holds a pidfd until Wait: a descriptor per running job, a third of what a sleeping
	// job held in the runner. The init step is reaped by its pid instead (finish): a child's pid is
	// not reused before it is reaped, and nothing else here reaps it.
	pid := cmd.Process.Pid
	_ = cmd.Process.Release()

	// The reports are short lines: a small buffer, held for the job's life, is enough.
	ws, ok, alone := p.follow(bufio.NewReaderSize(status, 128))
	status.Close()
	p.mu.Lock()
	p.exited = true
	g, release := p.g, p.release
	p.mu.Unlock()
	ended := false
	end := func(res Result) {
		p.result = res
		if p.in != nil {
			p.in.Close() // nothing is left to read it
		}
		close(p.ended)
		ended = true
	}
	res, err := p.finish(g, pid, ws, ok, alone, end)
	p.err = err
	if !ended {
		end(res)
	}
	// Removing the cgroup waits out the kernel's EBUSY while the last process is torn down
	// (retryRemove): the job's end is known before, and reported before (Ended).
	if err := g.remove(); err != nil {
		p.err = errors.Join(p.err, err)
	}
	release()
	close(p.done)
}

// follow reads the init step's reports (init.go) until the job's program has exited: it sends on
// joined and launched, and returns the program's wait status and whether the init said no other
// process of the job lived on (alone), or ok false when the init ended (killed, or the job never
// started) without reporting one.
func (p *Process) follow(r *bufio.Reader) (ws syscall.WaitStatus, ok, alone bool) {
	failed := func(err error) (syscall.WaitStatus, bool, bool) {
		select {
		case p.joined <- err:
		default:
		}
		p.launched <- err
		return 0, false, false
	}
	rest := func(prefix string) error {
		b, _ := io.ReadAll(r)
		if msg := prefix + string(b); msg != "" {
			return errors.New(msg)
		}
		return errors.New("init step exited")
	}
	b, err := r.ReadByte()
	if err != nil || b != '+' {
		if err != nil {
			return failed(rest(""))
		}
		return failed(rest(string(b)))
	}
	line, err := r.ReadString('\n')
	joinedAt, ok := parseReport(line, "")
	if err != nil || !ok {
		return failed(rest("+" + line))
	}
	p.mu.Lock()
	p.stages.Cgroup = joinedAt[0]
	p.mu.Unlock()
	p.joined <- nil
	line, err = r.ReadString('\n')
	pidAt, ok := parseReport(line, "pid ")
	if err != nil || !ok {
		return failed(rest(line))
	}
	p.mu.Lock()
	p.jobPid, p.stages.Exec = int(pidAt[0]), pidAt[1]
	p.mu.Unlock()
	p.launched <- nil
	line, err = r.ReadString('\n')
	statusAt, ok := parseReport(line, "status ")
	if err != nil || !ok || len(statusAt) != 3 {
		return 0, false, false
	}
	p.mu.Lock()
	p.stages.Exit = statusAt[2]
	p.mu.Unlock()
	return syscall.WaitStatus(statusAt[0]), true, statusAt[1] == 0
}

// parseReport parses one of the init step's status lines: prefix, then decimal fields separated
// by spaces, the last of them a CLOCK_MONOTONIC stamp, then a newline; it returns the fields. A
// line without prefix, or not ending in a number, is not a report.
func parseReport(line, prefix string) ([]time.Duration, bool) {
	rest, ok := strings.CutPrefix(line, prefix)
	if !ok || !strings.HasSuffix(rest, "\n") {
		return nil, false
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return nil, false
	}
	out := make([]time.Duration, len(fields))
	for i, f := range fields {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, false
		}
		out[i] = time.Duration(n)
	}
	return out, true
}

// finish ends the job after its main process: whatever is left in the cgroup is killed (a job ends
// when its shell ends), the init step reaped, then the usage is read; when nothing but the init was
// left, the result is final before the init is gone and finish gives it to end at once. A
// lingering job first waits until its output closes or it is killed; a job being killed first lets
// what is left use the rest of the kill's grace, so that a child's SIGTERM handler is not cut off
// when the shell dies first. ws is the job's program's wait status when the init reported one (ok),
// else the init's own counts (it was killed with the job). The caller removes the cgroup.
func (p *Process) finish(g group, initPid int, ws syscall.WaitStatus, ok, alone bool, end func(Result)) (Result, error) {
	var errs []error
	p.mu.Lock()
	linger, lingerCgroup := p.linger, p.lingerCgroup
	p.mu.Unlock()
	if lingerCgroup && ok {
		waitEmptyOrKicked(g.pids, p.kicked)
	}
	if (linger || lingerCgroup) && ok {
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
	early := false
	var res Result
	if killing {
		waitEmptyUntil(g.pids, killAt)
	} else if ok && alone {
		// Nothing of the job's is left, as its init said: its exit and usage are final now, before
		// the init has torn its namespaces down and is reaped (half a millisecond of a short job's
		// end here), and before the group is read (as long again on v1).
		var err error
		if res, err = jobResult(g, ws); err != nil {
			errs = append(errs, err)
		}
		end(res)
		early = true
		awaitInitExit(initPid)
	} else if initAlone(g, initPid) {
		awaitInitExit(initPid)
	}
	p.killMu.Lock()
	kerr := g.kill()
	p.killMu.Unlock()
	if kerr != nil {
		errs = append(errs, fmt.Errorf("kill leftovers: %w", kerr))
	}
	var initWS unix.WaitStatus
	_, werr := unix.Wait4(initPid, &initWS, 0, nil)
	for errors.Is(werr, unix.EINTR) {
		_, werr = unix.Wait4(initPid, &initWS, 0, nil)
	}
	if werr != nil {
		errs = append(errs, fmt.Errorf("wait: %w", werr))
	} else if !ok {
		ws = syscall.WaitStatus(initWS)
	}
	if !early {
		var err error
		if res, err = jobResult(g, ws); err != nil {
			errs = append(errs, err)
		}
	}
	return res, errors.Join(errs...)
}

// jobResult is the Result of a job whose program ended with ws, with the group's usage.
func jobResult(g group, ws syscall.WaitStatus) (Result, error) {
	res := Result{ExitCode: ws.ExitStatus()}
	if ws.Signaled() {
		res.Signal = int(ws.Signal())
		res.ExitCode = 128 + res.Signal
	}
	u, err := g.usage()
	if err != nil {
		err = fmt.Errorf("read usage: %w", err)
	}
	res.OOMKilled, res.CPU, res.MemoryPeak = u.oomKilled, u.cpu, u.memoryPeak
	return res, err
}

// Pid is the job's program's pid as the host sees it (the job's shell; bwrap for a readonly job),
// which is also its process group id: `kill PID` on the host reaches it as it would any process.
// Inside its namespace its init is pid 1 and the job's shell pid 2 (higher with the Go init, whose
// runtime threads come first).
func (p *Process) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.jobPid
}

// Stages are when a job passed the steps of its start and end, as CLOCK_MONOTONIC readings
// (Monotonic's clock); zero for a step not passed yet. They are stamped by the init step when it
// reports them (init.go), not when the runner reads the report: the times the kernel gave the
// job, however late the runner gets to them.
type Stages struct {
	// Cgroup: the job's cgroup was ready for it. On the cold path, when the init step had joined
	// it; for a warm init step (warm.go), which joined a spare cgroup long before, when Start had
	// renamed that cgroup to the job's and applied the job's limits.
	Cgroup time.Duration
	// Exec: the job's process was forked, in its cgroup and namespaces, and about to execute the
	// job's program (the C init step stamps it just before; the Go one just after).
	Exec time.Duration
	// Exit: the init step reaped the job's program.
	Exit time.Duration
}

// Stages returns the steps the job has passed so far.
func (p *Process) Stages() Stages {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stages
}

// Monotonic is CLOCK_MONOTONIC now, the clock of Stages: the kernel's time since boot, which every
// process on the host reads alike.
func Monotonic() time.Duration {
	var ts unix.Timespec
	// CLOCK_MONOTONIC is always there: an error cannot happen.
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

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
	if p.jobPid == 0 {
		return fmt.Errorf("signal %s: the job has not started", sig)
	}
	if err := unix.Kill(-p.jobPid, sig); err != nil {
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
	if !p.exited && p.jobPid > 0 {
		if err := unix.Kill(-p.jobPid, unix.SIGTERM); err != nil && !errors.Is(err, unix.ESRCH) {
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
	if p.jobPid > 0 {
		_ = unix.Kill(-p.jobPid, unix.SIGKILL)
	}
	g := p.g
	p.mu.Unlock()
	p.killMu.Lock()
	defer p.killMu.Unlock()
	// An error here leaves processes that finish's own kill, after the main process dies, meets
	// again and reports through Wait.
	_ = g.kill()
}

// Ended is closed once the job is over and Result says how; its cgroup is removed after (Wait).
func (p *Process) Ended() <-chan struct{} { return p.ended }

// Result is how the job ended; valid once Ended is closed.
func (p *Process) Result() Result {
	<-p.ended
	return p.result
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
