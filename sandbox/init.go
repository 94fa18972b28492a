package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// initArg0 is argv[0] of the v1 init step; MaybeInit recognises the re-executed binary by it. Its
// environment is empty (the job's comes on jobFD, initEnv).
const initArg0 = "sbx-init"

// statusFD is the init step's CLOEXEC status pipe: a failure is written to it; a successful exec
// closes it with nothing written.
const statusFD = 3

// initEnv encodes the environment the cold init step reads on jobFD and execs the job with: each
// KEY=VALUE entry NUL-terminated (Spec.validate refuses NUL bytes in them).
func initEnv(env []string) []byte {
	var b []byte
	for _, kv := range env {
		b = append(append(b, kv...), 0)
	}
	return b
}

// parseInitEnv reverses initEnv.
func parseInitEnv(b []byte) ([]string, error) {
	if len(b) == 0 {
		return []string{}, nil
	}
	if b[len(b)-1] != 0 {
		return nil, errors.New("init: malformed environment")
	}
	return strings.Split(string(b[:len(b)-1]), "\x00"), nil
}

// initArgs encodes the init step's argv: initArg0, the credential (Credential.String), the number of
// cgroup.procs files, those files, then the program's path and argv.
func initArgs(cred *Credential, procs []string, path string, argv []string) []string {
	args := append([]string{initArg0, cred.String(), strconv.Itoa(len(procs))}, procs...)
	return append(append(args, path), argv...)
}

// parseInitArgs reverses initArgs, given os.Args[1:].
func parseInitArgs(args []string) (cred *Credential, procs []string, path string, argv []string, err error) {
	if len(args) < 2 {
		return nil, nil, "", nil, errors.New("init: too few arguments")
	}
	if cred, err = parseCredential(args[0]); err != nil {
		return nil, nil, "", nil, fmt.Errorf("init: %w", err)
	}
	args = args[1:]
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 0 || len(args) < n+3 {
		return nil, nil, "", nil, fmt.Errorf("init: malformed arguments %q", args)
	}
	return cred, args[1 : 1+n], args[1+n], args[2+n:], nil
}

// MaybeInit must be the first thing in main() and in TestMain of any package whose tests start
// processes. In the v1 init step (this binary re-executed by Start) it moves the process into the
// job's cgroups and execs the job's program, never returning; otherwise it returns at once.
//
// The init step runs Go runtime start-up and package init functions before it gets here, outside
// the job's cgroups; nothing it runs can fork before the join, so nothing escapes.
//
// Run as the readonly probe (argv[1] probeArg, see ProbeReadonly) it checks the sandbox from inside
// and exits.
func MaybeInit() {
	if len(os.Args) == 2 && os.Args[1] == probeArg {
		os.Exit(probe(os.Stdout))
	}
	if len(os.Args) == 0 || os.Args[0] != initArg0 {
		return
	}
	err := initStep(os.Args[1:])
	status := os.NewFile(statusFD, "status")
	fmt.Fprint(status, err)
	os.Exit(1)
}

// initStep joins the cgroups, drops to the credential and execs the program; it returns only on
// failure.
func initStep(args []string) error {
	cred, procs, path, argv, err := parseInitArgs(args)
	if err != nil {
		return err
	}
	// The parent-death signal, the credential and the exec all belong to one thread.
	runtime.LockOSThread()
	parent := os.Getppid()
	pid := strconv.Itoa(os.Getpid())
	for _, p := range procs {
		// Writing a pid to cgroup.procs moves the whole thread group, Go runtime threads included.
		if err := writeValue(p, pid); err != nil {
			return fmt.Errorf("join cgroup: %w", err)
		}
	}
	if cred != nil {
		if err := dropTo(cred, parent); err != nil {
			return err
		}
		// The runner entered the directory before the drop; the job must be allowed to as well.
		if err := unix.Chdir("."); err != nil {
			return fmt.Errorf("chdir to the working directory: %w", err)
		}
	}
	if _, err := unix.FcntlInt(statusFD, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return fmt.Errorf("init status pipe: %w", err)
	}
	f := os.NewFile(jobFD, "env")
	b, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("init: read environment: %w", err)
	}
	env, err := parseInitEnv(b)
	if err != nil {
		return err
	}
	err = unix.Exec(path, argv, env)
	return fmt.Errorf("exec %s: %w", path, err)
}

// dropTo sets the process's groups, gid and uid (on every thread) to cred. Changing the credential
// clears the parent-death signal, so it is armed again, and the parent checked: a runner that died in
// between must not leave the job running.
func dropTo(cred *Credential, parent int) error {
	groups := make([]int, len(cred.Groups))
	for i, g := range cred.Groups {
		groups[i] = int(g)
	}
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setgid(int(cred.GID)); err != nil {
		return fmt.Errorf("setgid %d: %w", cred.GID, err)
	}
	if err := syscall.Setuid(int(cred.UID)); err != nil {
		return fmt.Errorf("setuid %d: %w", cred.UID, err)
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("parent-death signal: %w", err)
	}
	if os.Getppid() != parent {
		return errors.New("init: the runner exited")
	}
	return nil
}
