package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Every job starts as this binary re-executed as the init step (argv[0] initArg0), cloned into a new
// pid and mount namespace whose pid 1 it is, with an empty environment: nothing of the job's reaches
// a process that runs outside the job, as the runner's user, before the job's own program. The init
// joins the job's cgroups (v1; on v2 the clone places it there), makes every mount private, mounts
// a fresh /proc, reads the job on jobFD (jobMessage) and starts the job's program as its
// child, in its own process group (a session of its own on the job's terminal: Spec.TTY), as the
// job's credential. It then reaps until the namespace is empty. Other jobs' processes are thus
// invisible to the job and out of its reach (kill, ptrace, /proc/PID/environ), whatever user both
// run as; the host's processes likewise.
//
// The init reports on statusFD, in order: "+T\n" once it joined its cgroups (a warm step then waits
// for its job), "pid N T\n" with the job's pid as the host sees it once the program was executed, or
// else the reason it was not, as text, and then "status W L T\n", the job's wait status and L 1 when
// other processes of its namespace live on (0 when none does), when the job's
// process ends. Each T is CLOCK_MONOTONIC in nanoseconds when the init (or the job's process, about
// to execute its program) wrote the message: Process.Stages are the kernel's times, not when the
// runner came to read them. It ignores every signal the host sends it but SIGKILL, as pid 1 of a namespace does
// by default, so that a kill's SIGTERM reaches the job's processes only; when it dies the kernel kills
// everything in its namespace.
const (
	// initArg0 is argv[0] of the init step; MaybeInit and the C constructor recognise it.
	initArg0 = "sbx-init"
	// statusFD is the init step's status pipe.
	statusFD = 3
	// jobFD is where the init step reads its job (jobMessage): a file written before the start, or a
	// warm step's pipe.
	jobFD = seccompFD + 1
)

// initArgs is the init step's argv: initArg0, the number of cgroup.procs files to join, those files.
func initArgs(procs []string) []string {
	return append([]string{initArg0, strconv.Itoa(len(procs))}, procs...)
}

// parseInitArgs reverses initArgs, given os.Args[1:].
func parseInitArgs(args []string) ([]string, error) {
	if len(args) < 1 {
		return nil, errors.New("init: too few arguments")
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n != len(args)-1 {
		return nil, fmt.Errorf("init: malformed arguments %q", args)
	}
	return args[1:], nil
}

// job is what the init step runs, as jobMessage carries it.
type job struct {
	readonly bool // bwrap: keep seccompFD and argsFD open for it
	tty      bool // descriptor 0 is the job's terminal: the child, not the init, takes it (Spec.TTY)
	cred     *Credential
	dir      string
	path     string
	argv     []string
	env      []string
}

// jobMessage is the job the init step runs: NUL-terminated fields seccomp ("1" keeps seccompFD and
// argsFD open for bwrap), tty ("1": Spec.TTY), credential (Credential.String), dir, path, argc,
// argv..., envc, env... (Spec.validate refuses NUL bytes in all).
func jobMessage(spec Spec, readonly bool) []byte {
	var b bytes.Buffer
	field := func(s string) {
		b.WriteString(s)
		b.WriteByte(0)
	}
	dir := spec.Dir
	if dir == "" {
		dir = "/"
	}
	args := spec.Args
	if len(args) == 0 {
		args = []string{spec.Path}
	}
	flag := func(b bool) {
		if b {
			field("1")
		} else {
			field("0")
		}
	}
	flag(readonly)
	flag(spec.TTY)
	field(spec.Credential.String())
	field(dir)
	field(spec.Path)
	field(strconv.Itoa(len(args)))
	for _, a := range args {
		field(a)
	}
	field(strconv.Itoa(len(spec.Env)))
	for _, e := range spec.Env {
		field(e)
	}
	return b.Bytes()
}

// parseJobMessage reverses jobMessage.
func parseJobMessage(b []byte) (job, error) {
	bad := errors.New("init: malformed job message")
	if len(b) == 0 || b[len(b)-1] != 0 {
		return job{}, bad
	}
	f := strings.Split(string(b[:len(b)-1]), "\x00")
	if len(f) < 7 {
		return job{}, bad
	}
	cred, err := parseCredential(f[2])
	if err != nil {
		return job{}, fmt.Errorf("init: %w", err)
	}
	j := job{readonly: f[0] == "1", tty: f[1] == "1", cred: cred, dir: f[3], path: f[4]}
	argc, err := strconv.Atoi(f[5])
	if err != nil || argc < 0 || 7+argc > len(f) {
		return job{}, bad
	}
	j.argv = f[6 : 6+argc]
	envc, err := strconv.Atoi(f[6+argc])
	if err != nil || 7+argc+envc != len(f) {
		return job{}, bad
	}
	j.env = f[7+argc:]
	return j, nil
}

// MaybeInit must be the first thing in main() and in TestMain of any package whose tests start
// processes. In the init step (this binary re-executed by Start) it runs the job and never returns;
// otherwise it returns at once. With cgo the C constructor (init_cgo.go) has done so before the Go
// runtime started.
//
// The Go init step runs Go runtime start-up and package init functions before it gets here, outside
// the job's cgroups; nothing it runs can fork before the join, so nothing escapes.
//
// Run as the readonly probe (argv[1] probeArg, see ProbeReadonly) it checks the sandbox from inside
// and exits; run as a fence (argv[0] fenceArg0, see StartFence) it watches its runner until it
// fires or the runner is gone, and exits.
func MaybeInit() {
	if len(os.Args) == 2 && os.Args[1] == probeArg {
		os.Exit(probe(os.Stdout))
	}
	if len(os.Args) > 0 && os.Args[0] == fenceArg0 {
		os.Exit(fenceMain(os.Args[1:]))
	}
	if len(os.Args) == 0 || os.Args[0] != initArg0 {
		return
	}
	code, err := initMain(os.Args[1:])
	if err != nil {
		fmt.Fprint(os.NewFile(statusFD, "status"), err)
	}
	os.Exit(code)
}

// initMain is the Go init step; it returns the exit code, and an error when the job did not start.
func initMain(args []string) (int, error) {
	procs, err := parseInitArgs(args)
	if err != nil {
		return 1, err
	}
	if os.Getpid() != 1 {
		return 1, errors.New("init: not pid 1 of a new pid namespace")
	}
	// The fork and the reading of the job's host pid belong to one thread.
	runtime.LockOSThread()
	// Go's handlers make the kernel deliver the host's signals to pid 1, and they are reset in the
	// job's child; unread, they change nothing.
	signal.Notify(make(chan os.Signal, 1))
	for _, p := range procs {
		// Writing a pid to cgroup.procs moves the whole thread group, Go runtime threads included.
		if err := writeValue(p, "1"); err != nil {
			return 1, fmt.Errorf("join cgroup: %w", err)
		}
	}
	status := os.NewFile(statusFD, "status")
	if _, err := fmt.Fprintf(status, "+%d\n", int64(Monotonic())); err != nil {
		return 1, fmt.Errorf("init: status pipe: %w", err)
	}
	// The mounts are the same for every job: made before the job is read, as the C init step does.
	if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return 1, fmt.Errorf("init: make mounts private: %w", err)
	}
	procfd, err := unix.Open("/proc", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 1, fmt.Errorf("init: open /proc: %w", err)
	}
	// Above the job's descriptors (0 to argsFD), some of which may be free now and are closed later.
	oldproc, err := unix.FcntlInt(uintptr(procfd), unix.F_DUPFD_CLOEXEC, argsFD+1)
	unix.Close(procfd)
	if err != nil {
		return 1, fmt.Errorf("init: open /proc: %w", err)
	}
	// Detached, the host's /proc is reachable through oldproc only, not under the fresh one.
	if err := unix.Unmount("/proc", unix.MNT_DETACH); err != nil {
		return 1, fmt.Errorf("init: detach /proc: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return 1, fmt.Errorf("init: mount /proc: %w", err)
	}
	in := os.NewFile(jobFD, "job")
	msg, err := io.ReadAll(in)
	in.Close()
	if err != nil {
		return 1, fmt.Errorf("init: read job message: %w", err)
	}
	j, err := parseJobMessage(msg)
	if err != nil {
		return 1, err
	}
	none := ^uintptr(0)
	files := []uintptr{0, 1, 2, none, none, none, none}
	if j.readonly {
		files[seccompFD], files[argsFD] = seccompFD, argsFD
	}
	attr := &syscall.ProcAttr{Dir: j.dir, Env: j.env, Files: files, Sys: &syscall.SysProcAttr{Setpgid: true}}
	if j.tty {
		// setsid makes the child its own group as well (setpgid after it would fail); the terminal
		// is its descriptor 0.
		attr.Sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	}
	if c := j.cred; c != nil {
		attr.Sys.Credential = &syscall.Credential{Uid: c.UID, Gid: c.GID, Groups: c.Groups}
	}
	pid, err := syscall.ForkExec(j.path, j.argv, attr)
	if err != nil {
		return 1, fmt.Errorf("exec %s: %w", j.path, err)
	}
	// ForkExec returns once the program is executed: the nearest this init can stamp it.
	execAt := Monotonic()
	host, err := hostChild(oldproc)
	if err != nil {
		return 1, err
	}
	unix.Close(oldproc)
	for fd := 0; fd <= argsFD; fd++ {
		if fd != statusFD {
			unix.Close(fd)
		}
	}
	if _, err := fmt.Fprintf(status, "pid %d %d\n", host, int64(execAt)); err != nil {
		return 1, nil
	}
	code := 1
	for {
		var ws unix.WaitStatus
		w, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return code, nil // ECHILD: the namespace is empty
		}
		if w == pid {
			at := Monotonic()
			fmt.Fprintf(status, "status %d %d %d\n", int(ws), othersLeft(), int64(at))
			code = ws.ExitStatus()
			if ws.Signaled() {
				code = 128 + int(ws.Signal())
			}
		}
	}
}

// othersLeft is 1 when processes of the init's namespace other than the job's reaped program live
// on, else 0. Every one of them is a descendant of the init (orphans are reparented to it), so none
// is left when wait4 finds no child after reaping those already exited.
func othersLeft() int {
	for {
		var ws unix.WaitStatus
		w, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		switch {
		case err == unix.EINTR || err == nil && w > 0:
		case err == unix.ECHILD:
			return 0
		default:
			return 1
		}
	}
}

// hostChild reads the host pid of this thread's first child, the job, through the host's /proc
// (oldproc).
func hostChild(oldproc int) (int, error) {
	buf := make([]byte, 64)
	n, err := unix.Readlinkat(oldproc, "thread-self", buf)
	if err != nil {
		return 0, fmt.Errorf("init: read host pid: %w", err)
	}
	fd, err := unix.Openat(oldproc, string(buf[:n])+"/children", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("init: read host pid: %w", err)
	}
	f := os.NewFile(uintptr(fd), "children")
	b, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("init: read host pid: %w", err)
	}
	// The job is the first: orphans the job left are appended as they are reparented to the init.
	f0, _, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	pid, err := strconv.Atoi(f0)
	if err != nil {
		return 0, fmt.Errorf("init: read host pid: children %q", b)
	}
	return pid, nil
}
