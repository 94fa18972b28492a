package sandbox

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// initArg0 is argv[0] of the v1 init step; MaybeInit recognises the re-executed binary by it, which
// leaves the environment free to be exactly the job's.
const initArg0 = "sbx-init"

// statusFD is the init step's CLOEXEC status pipe: a failure is written to it; a successful exec
// closes it with nothing written.
const statusFD = 3

// initArgs encodes the init step's argv: initArg0, the number of cgroup.procs files, those files,
// then the program's path and argv.
func initArgs(procs []string, path string, argv []string) []string {
	args := append([]string{initArg0, strconv.Itoa(len(procs))}, procs...)
	return append(append(args, path), argv...)
}

// parseInitArgs reverses initArgs, given os.Args[1:].
func parseInitArgs(args []string) (procs []string, path string, argv []string, err error) {
	if len(args) == 0 {
		return nil, "", nil, errors.New("init: no arguments")
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 0 || len(args) < n+3 {
		return nil, "", nil, fmt.Errorf("init: malformed arguments %q", args)
	}
	return args[1 : 1+n], args[1+n], args[2+n:], nil
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

// initStep joins the cgroups and execs the program; it returns only on failure.
func initStep(args []string) error {
	procs, path, argv, err := parseInitArgs(args)
	if err != nil {
		return err
	}
	pid := strconv.Itoa(os.Getpid())
	for _, p := range procs {
		// Writing a pid to cgroup.procs moves the whole thread group, Go runtime threads included.
		if err := writeValue(p, pid); err != nil {
			return fmt.Errorf("join cgroup: %w", err)
		}
	}
	if _, err := unix.FcntlInt(statusFD, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return fmt.Errorf("init status pipe: %w", err)
	}
	// The environment is exactly what Start passed, which is the job's.
	err = unix.Exec(path, argv, os.Environ())
	return fmt.Errorf("exec %s: %w", path, err)
}
