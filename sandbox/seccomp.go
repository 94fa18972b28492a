package sandbox

import (
	"errors"

	"golang.org/x/sys/unix"
)

// ErrNoSeccomp reports that this build cannot compile the readonly seccomp filter (built without cgo);
// readonly jobs are refused rather than run without it.
var ErrNoSeccomp = errors.New("sandbox: readonly needs a cgo build with libseccomp")

// seccompFilter is a seccomp filter as data; compileSeccomp is the one function that turns it into
// libseccomp calls. Every syscall not named by a rule gets DefaultAllow; every syscall made through an
// ABI other than the native one (i386 int 0x80, x32's nr|0x40000000) kills the process: only the native
// architecture is in the filter and the bad-arch action is SECCOMP_RET_KILL_PROCESS.
type seccompFilter struct {
	// Rules list the refused calls; a call matching one gets its errno.
	Rules []seccompRule
}

// seccompRule refuses one syscall with Errno when every one of Args matches (all of them; none means
// always).
type seccompRule struct {
	Syscall string
	Errno   unix.Errno
	Args    []seccompArg
}

// seccompArg matches when argument Index masked with Mask equals Value. A mask that keeps only the
// low 32 bits compares an int argument as the kernel reads it: a domain of 1|1<<32 is still AF_UNIX.
type seccompArg struct {
	Index uint
	Mask  uint64
	Value uint64
}

// low32 keeps the bits of an int argument.
const low32 = 0xffffffff

// sockTypeMask strips the flags socket(2) and socketpair(2) accept in their type argument.
const sockTypeMask = low32 &^ uint64(unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)

// readonlyFilter is the filter of a readonly job (see DESIGN.md, "Runner: readonly", and
// docs/readonly.md, which has a row for each rule):
//   - no AF_UNIX socket, so that no host daemon listening on a path (docker.sock…) is reachable
//     (--unshare-net already hides abstract sockets and every network address);
//   - no AF_UNIX datagram or raw socketpair;
//   - no io_uring, which can open sockets and files without the syscalls above;
//   - no AF_VSOCK socket: vsock addresses the hypervisor and other VMs, outside any network namespace;
//   - no clone3, whose CLONE_INTO_CGROUP starts a child in any cgroup whose cgroup.procs the job's
//     uid may write, read-only mount or not (the kernel checks the file's owner, not the mount).
//     ENOSYS, not EPERM: glibc and Go then fall back to clone, which has no such flag;
//   - no keyring calls: the job shares the runner's session keyring and its uid's user keyring;
//   - no flock and no file lease: both work on a descriptor opened read-only, and a lock or lease
//     held on a host file stalls the host's writers (a lease for fs.lease-break-time each open).
//     POSIX record locks stay allowed: docs/readonly.md says why.
var readonlyFilter = seccompFilter{Rules: []seccompRule{
	{Syscall: "socket", Errno: unix.EPERM, Args: []seccompArg{{0, low32, unix.AF_UNIX}}},
	{Syscall: "socket", Errno: unix.EPERM, Args: []seccompArg{{0, low32, unix.AF_VSOCK}}},
	{Syscall: "socketpair", Errno: unix.EPERM, Args: []seccompArg{{0, low32, unix.AF_UNIX}, {1, sockTypeMask, unix.SOCK_DGRAM}}},
	{Syscall: "socketpair", Errno: unix.EPERM, Args: []seccompArg{{0, low32, unix.AF_UNIX}, {1, sockTypeMask, unix.SOCK_RAW}}},
	{Syscall: "io_uring_setup", Errno: unix.EPERM},
	{Syscall: "io_uring_enter", Errno: unix.EPERM},
	{Syscall: "io_uring_register", Errno: unix.EPERM},
	{Syscall: "clone3", Errno: unix.ENOSYS},
	{Syscall: "keyctl", Errno: unix.EPERM},
	{Syscall: "add_key", Errno: unix.EPERM},
	{Syscall: "request_key", Errno: unix.EPERM},
	{Syscall: "flock", Errno: unix.EPERM},
	{Syscall: "fcntl", Errno: unix.EPERM, Args: []seccompArg{{1, low32, unix.F_SETLEASE}}},
}}
