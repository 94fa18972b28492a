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
	type nrs struct{ socket, socketpair, ioUringSetup, ioUringEnter, getpid int32 }
	x8664 := nrs{unix.SYS_SOCKET, unix.SYS_SOCKETPAIR, unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_GETPID}
	abis := []struct {
		name string
		arch uint32
		bit  int32
		nr   nrs
		// want is the verdict for a call the native ABI would allow; refused is for one it refuses.
		allowed, refused uint32
	}{
		{"x86_64", auditArchX8664, 0, x8664, retAllow, eperm},
		{"x32", auditArchX8664, x32Bit, x8664, retKillProcess, retKillProcess},
		// i386: socket 359, socketpair 360, io_uring_setup 425, io_uring_enter 426, getpid 20.
		{"i386", auditArchI386, 0, nrs{359, 360, 425, 426, 20}, retKillProcess, retKillProcess},
	}
	calls := []struct {
		name    string
		nr      func(nrs) int32
		args    []uint64
		refused bool
	}{
		{"socket AF_UNIX", func(n nrs) int32 { return n.socket }, []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0}, true},
		{"socket AF_UNIX high bits", func(n nrs) int32 { return n.socket }, []uint64{unix.AF_UNIX | 1<<32, unix.SOCK_STREAM, 0}, true},
		{"socket AF_UNIX all high bits", func(n nrs) int32 { return n.socket }, []uint64{unix.AF_UNIX | 0xffffffff00000000, unix.SOCK_STREAM, 0}, true},
		{"socket AF_INET", func(n nrs) int32 { return n.socket }, []uint64{unix.AF_INET, unix.SOCK_STREAM, 0}, false},
		{"socket AF_INET6", func(n nrs) int32 { return n.socket }, []uint64{unix.AF_INET6, unix.SOCK_DGRAM, 0}, false},
		{"socketpair AF_UNIX DGRAM", func(n nrs) int32 { return n.socketpair }, []uint64{unix.AF_UNIX, unix.SOCK_DGRAM, 0}, true},
		{"socketpair AF_UNIX DGRAM|CLOEXEC|NONBLOCK", func(n nrs) int32 { return n.socketpair }, []uint64{unix.AF_UNIX, unix.SOCK_DGRAM | unix.SOCK_CLOEXEC | unix.SOCK_NONBLOCK, 0}, true},
		{"socketpair AF_UNIX RAW high bits", func(n nrs) int32 { return n.socketpair }, []uint64{unix.AF_UNIX | 1<<40, unix.SOCK_RAW | 1<<33, 0}, true},
		{"socketpair AF_UNIX STREAM", func(n nrs) int32 { return n.socketpair }, []uint64{unix.AF_UNIX, unix.SOCK_STREAM, 0}, false},
		{"io_uring_setup", func(n nrs) int32 { return n.ioUringSetup }, []uint64{8, 0}, true},
		{"io_uring_enter", func(n nrs) int32 { return n.ioUringEnter }, nil, true},
		{"getpid", func(n nrs) int32 { return n.getpid }, nil, false},
	}
	for _, abi := range abis {
		for _, c := range calls {
			t.Run(abi.name+"/"+c.name, func(t *testing.T) {
				want := abi.allowed
				if c.refused {
					want = abi.refused
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
