//go:build cgo && linux && amd64

package sandbox

import (
	"encoding/binary"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Audit architectures and seccomp return values from <linux/audit.h> and <linux/seccomp.h>.
const (
	auditArchX8664 = 0xc000003e
	auditArchI386  = 0x40000003
	x32Bit         = 0x40000000

	retKillProcess = 0x80000000
	retAllow       = 0x7fff0000
	retErrno       = 0x00050000
)

// seccompData is struct seccomp_data {int nr; u32 arch; u64 instruction_pointer; u64 args[6]} as an
// x86_64 kernel lays it out (little endian: each u64 is its low 32-bit word, then its high one). A
// seccomp filter reads it only in 32-bit words, which the kernel loads in native byte order while
// bpf.VM loads them in network order; so each word is stored big endian at its native offset, and the
// VM sees the values the kernel would.
func seccompData(nr int32, arch uint32, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[0:], uint32(nr))
	binary.BigEndian.PutUint32(b[4:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(b[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(b[20+8*i:], uint32(a>>32))
	}
	return b
}

// bpfProgram decodes an exported filter (struct sock_filter, native = little endian here).
func bpfProgram(t *testing.T, prog []byte) []bpf.Instruction {
	t.Helper()
	if len(prog)%8 != 0 || len(prog) == 0 {
		t.Fatalf("program of %d bytes is not a list of sock_filter", len(prog))
	}
	raw := make([]bpf.RawInstruction, len(prog)/8)
	for i := range raw {
		b := prog[8*i:]
		raw[i] = bpf.RawInstruction{
			Op: binary.LittleEndian.Uint16(b[0:]),
			Jt: b[2],
			Jf: b[3],
			K:  binary.LittleEndian.Uint32(b[4:]),
		}
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		t.Fatal("program has instructions the bpf package cannot decode")
	}
	return insns
}

// TestSeccompBPF runs the readonly filter, without the kernel, on synthetic seccomp_data for each ABI
// an x86_64 kernel accepts.
func TestSeccompBPF(t *testing.T) {
	prog, err := compileSeccomp(readonlyFilter)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := bpf.NewVM(bpfProgram(t, prog))
	if err != nil {
		t.Fatal(err)
	}
	eperm := uint32(retErrno | unix.EPERM)
	// Syscall numbers per ABI: x86_64 and x32 share a table (x32 sets bit 30), i386 has its own.
	type nrs struct {
		socket, socketpair, ioUringSetup, ioUringEnter, getpid int32
		clone3, keyctl, addKey, requestKey, flock, fcntl       int32
	}
	x8664 := nrs{unix.SYS_SOCKET, unix.SYS_SOCKETPAIR, unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_GETPID,
		unix.SYS_CLONE3, unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_FLOCK, unix.SYS_FCNTL}
	// i386, from arch/x86/entry/syscalls/syscall_32.tbl; fcntl is 55 (fcntl64, 221, takes the same
	// commands, and is killed as every i386 call is).
	i386 := nrs{359, 360, 425, 426, 20, 435, 288, 286, 287, 143, 55}
	abis := []struct {
		name string
		arch uint32
		bit  int32
		nr   nrs
		// native: the filter's own ABI, where a call gets its rule's verdict; every other is killed.
		native bool
	}{
		{"x86_64", auditArchX8664, 0, x8664, true},
		{"x32", auditArchX8664, x32Bit, x8664, false},
		{"i386", auditArchI386, 0, i386, false},
	}
	calls := []struct {
		name  string
		nr    func(nrs) int32
		args  []uint64
		errno unix.Errno // what the native ABI gets; 0 means allowed
	}{
		{"socket AF_UNIX", func(n nrs) int32 { return n.socket }, []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0}, unix.EPERM},
		{"socket AF_UNIX high bits", func(n nrs) int32 { return n.socket }, []uint64{unix.AF_UNIX | 1<<32, unix.SOCK_STREAM, 0}, unix.EPERM},
		{"socket AF_UNIX all high bits", func(n nrs) int32 { return n.socket }, []uint64{unix.AF_UNIX | 0xffffffff00000000, unix.SOCK_STREAM, 0}, unix.EPERM},
		{"socket AF_INET", func(n nrs) int32 { return n.socket }, []uint64{unix.AF_INET, unix.SOCK_STREAM, 0}, 0},
		{"socket AF_INET6", func(n nrs) int32 { return n.socket }, []uint64{unix.AF_INET6, unix.SOCK_DGRAM, 0}, 0},
		{"socket AF_VSOCK", func(n nrs) int32 { return n.socket }, []uint64{unix.AF_VSOCK, unix.SOCK_STREAM, 0}, unix.EPERM},
		{"socket AF_VSOCK high bits", func(n nrs) int32 { return n.socket }, []uint64{unix.AF_VSOCK | 1<<32, unix.SOCK_STREAM, 0}, unix.EPERM},
		{"socket AF_NETLINK", func(n nrs) int32 { return n.socket }, []uint64{unix.AF_NETLINK, unix.SOCK_RAW, 0}, 0},
		{"socketpair AF_UNIX DGRAM", func(n nrs) int32 { return n.socketpair }, []uint64{unix.AF_UNIX, unix.SOCK_DGRAM, 0}, unix.EPERM},
		{"socketpair AF_UNIX DGRAM|CLOEXEC|NONBLOCK", func(n nrs) int32 { return n.socketpair }, []uint64{unix.AF_UNIX, unix.SOCK_DGRAM | unix.SOCK_CLOEXEC | unix.SOCK_NONBLOCK, 0}, unix.EPERM},
		{"socketpair AF_UNIX RAW high bits", func(n nrs) int32 { return n.socketpair }, []uint64{unix.AF_UNIX | 1<<40, unix.SOCK_RAW | 1<<33, 0}, unix.EPERM},
		{"socketpair AF_UNIX STREAM", func(n nrs) int32 { return n.socketpair }, []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0}, 0},
		{"io_uring_setup", func(n nrs) int32 { return n.ioUringSetup }, []uint64{8, 0}, unix.EPERM},
		{"io_uring_enter", func(n nrs) int32 { return n.ioUringEnter }, nil, unix.EPERM},
		{"clone3", func(n nrs) int32 { return n.clone3 }, []uint64{0x7ffd0000, 88}, unix.ENOSYS},
		{"keyctl", func(n nrs) int32 { return n.keyctl }, []uint64{unix.KEYCTL_GET_KEYRING_ID, 0xfffffffd, 0}, unix.EPERM},
		{"add_key", func(n nrs) int32 { return n.addKey }, []uint64{0x1000, 0x2000, 0, 0, 0xfffffffd}, unix.EPERM},
		{"request_key", func(n nrs) int32 { return n.requestKey }, []uint64{0x1000, 0x2000, 0, 0}, unix.EPERM},
		{"flock LOCK_EX", func(n nrs) int32 { return n.flock }, []uint64{3, unix.LOCK_EX}, unix.EPERM},
		{"flock LOCK_SH|LOCK_NB", func(n nrs) int32 { return n.flock }, []uint64{3, unix.LOCK_SH | unix.LOCK_NB}, unix.EPERM},
		{"fcntl F_SETLEASE", func(n nrs) int32 { return n.fcntl }, []uint64{3, unix.F_SETLEASE, unix.F_RDLCK}, unix.EPERM},
		{"fcntl F_SETLEASE high bits", func(n nrs) int32 { return n.fcntl }, []uint64{3, unix.F_SETLEASE | 1<<32, unix.F_RDLCK}, unix.EPERM},
		{"fcntl F_GETLEASE", func(n nrs) int32 { return n.fcntl }, []uint64{3, unix.F_GETLEASE}, 0},
		{"fcntl F_SETLK", func(n nrs) int32 { return n.fcntl }, []uint64{3, unix.F_SETLK, 0x1000}, 0},
		{"fcntl F_OFD_SETLKW", func(n nrs) int32 { return n.fcntl }, []uint64{3, unix.F_OFD_SETLKW, 0x1000}, 0},
		{"fcntl F_SETFD", func(n nrs) int32 { return n.fcntl }, []uint64{3, unix.F_SETFD, unix.FD_CLOEXEC}, 0},
		{"getpid", func(n nrs) int32 { return n.getpid }, nil, 0},
	}
	for _, abi := range abis {
		for _, c := range calls {
			t.Run(abi.name+"/"+c.name, func(t *testing.T) {
				want := uint32(retKillProcess)
				switch {
				case abi.native && c.errno == 0:
					want = retAllow
				case abi.native:
					want = retErrno | uint32(c.errno)
				}
				got, err := vm.Run(seccompData(c.nr(abi.nr)|abi.bit, abi.arch, c.args...))
				if err != nil {
					t.Fatal(err)
				}
				if uint32(got) != want {
					t.Errorf("filter returned %#x, want %#x", uint32(got), want)
				}
			})
		}
	}
	// io_uring_register on x86_64, and an unknown architecture.
	if got, _ := vm.Run(seccompData(unix.SYS_IO_URING_REGISTER, auditArchX8664)); uint32(got) != eperm {
		t.Errorf("io_uring_register: %#x, want EPERM", uint32(got))
	}
	if got, _ := vm.Run(seccompData(unix.SYS_GETPID, 0xc00000b7)); uint32(got) != retKillProcess { // aarch64
		t.Errorf("foreign arch getpid: %#x, want kill", uint32(got))
	}
}
