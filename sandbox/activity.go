package sandbox

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Activity is what /proc shows of a job's processes at one moment.
type Activity struct {
	// WaitingForInput: at least one process is blocked reading the job's input (its stdin pipe, or
	// its terminal), and every other one is too, or waits for a child, or is a readonly job's bwrap.
	// A process blocked on anything else (a pipe that is not the job's input, a socket, a sleep) or
	// running means the job is not waiting for input.
	WaitingForInput bool
	// Listening lists the TCP addresses its processes' sockets listen on, sorted.
	Listening []netip.AddrPort
}

// fileID names an open file by device and inode, as stat(2) reports it through any descriptor.
type fileID struct {
	dev, ino uint64
}

func statID(path string) (fileID, bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, false
	}
	return fileID{st.Dev, st.Ino}, true
}

func fstatID(f *os.File) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fileID{}, fmt.Errorf("stat input: %w", err)
	}
	return fileID{st.Dev, st.Ino}, nil
}

// Activity looks at the job's processes in /proc: whether they wait for input (only for a job with
// an input: Spec.Stdin or Spec.TTY), and, unless the job is readonly (its network is its own, which
// nobody else can reach), the TCP ports they listen on. A process that exits while it is looked at
// is skipped. Reading other users' /proc/PID/syscall and mem takes the runner's privileges (root).
func (p *Process) Activity() (Activity, error) {
	p.mu.Lock()
	g, exited := p.g, p.exited
	p.mu.Unlock()
	var a Activity
	if exited {
		return a, nil
	}
	pids, err := g.pids()
	if err != nil {
		if removed(err) {
			return a, nil
		}
		return a, fmt.Errorf("activity: %w", err)
	}
	if p.hasInput {
		a.WaitingForInput = p.waitingForInput(pids)
	}
	if !p.readonly {
		if a.Listening, err = listening(pids); err != nil {
			return a, fmt.Errorf("activity: %w", err)
		}
	}
	return a, nil
}

// waitingForInput reports whether pids all wait, and at least one reads the job's input.
func (p *Process) waitingForInput(pids []int) bool {
	reading := false
	for _, pid := range pids {
		switch p.waitOf(pid) {
		case waitInput:
			reading = true
		case waitChild:
		case waitGone:
		default:
			return false
		}
	}
	return reading
}

type wait int

const (
	waitOther wait = iota // running, or blocked on something else
	waitInput             // blocked reading the job's input
	waitChild             // blocked waiting for a child, or a supervisor (bwrap)
	waitGone              // exited meanwhile
)

// waitOf tells what one process is doing, from /proc/PID/stat (its state), /proc/PID/syscall (the
// system call it is blocked in and its arguments) and, for select and poll, the descriptor sets in
// its memory.
func (p *Process) waitOf(pid int) wait {
	dir := "/proc/" + strconv.Itoa(pid)
	if p.supervisor != "" {
		if exe, err := os.Readlink(dir + "/exe"); err == nil && exe == p.supervisor {
			return waitChild
		}
	}
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return waitGone
	}
	// The state follows the command name, which may hold anything but ends with the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return waitOther
	}
	switch stat[i+2] {
	case 'S': // an interruptible sleep: where a read of a pipe or terminal waits
	case 'Z', 'X':
		return waitGone
	default:
		return waitOther
	}
	raw, err := os.ReadFile(dir + "/syscall")
	if err != nil {
		return waitOther
	}
	f := strings.Fields(string(raw))
	if len(f) < 5 {
		return waitOther // "running", or not in a system call
	}
	nr, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		return waitOther
	}
	var args [4]uint64
	for k := range args {
		if args[k], err = strconv.ParseUint(strings.TrimPrefix(f[k+1], "0x"), 16, 64); err != nil {
			return waitOther
		}
	}
	isInput := func(fd uint64) bool {
		id, ok := statID(dir + "/fd/" + strconv.FormatUint(fd, 10))
		return ok && id == p.input
	}
	switch kind := readCalls[nr]; kind {
	case callRead:
		if isInput(args[0]) {
			return waitInput
		}
	case callWait:
		return waitChild
	case callSelect:
		if selectsInput(dir, args, isInput) {
			return waitInput
		}
	case callPoll:
		if pollsInput(dir, args[0], args[1], isInput) {
			return waitInput
		}
	}
	return waitOther
}

// Kinds of system call a process may wait in.
const (
	callOther = iota
	callRead
	callSelect
	callPoll
	callWait
)

// readCalls sorts the system calls waitOf understands, by this architecture's numbers (select and
// poll exist only on some: see syscalls_*.go).
var readCalls = archCalls(map[int64]int{
	unix.SYS_READ: callRead, unix.SYS_READV: callRead, unix.SYS_PREAD64: callRead, unix.SYS_PREADV: callRead, unix.SYS_PREADV2: callRead,
	unix.SYS_PSELECT6: callSelect, unix.SYS_PPOLL: callPoll,
	unix.SYS_WAIT4: callWait, unix.SYS_WAITID: callWait,
})

// maxWaitFDs bounds the descriptors of a select or poll that waitOf reads: a process waiting on
// more than that is not a prompt.
const maxWaitFDs = 1024

// selectsInput reports whether a select(nfds, readfds, writefds, exceptfds) waits for the job's
// input and for nothing else.
func selectsInput(dir string, args [4]uint64, isInput func(uint64) bool) bool {
	nfds := args[0]
	if nfds == 0 || nfds > maxWaitFDs || args[1] == 0 {
		return false
	}
	size := int((nfds + 63) / 64 * 8)
	sets := make([][]byte, 3)
	for k := range sets {
		if args[k+1] == 0 {
			continue
		}
		b, ok := readMem(dir, args[k+1], size)
		if !ok {
			return false
		}
		sets[k] = b
	}
	found := false
	for fd := uint64(0); fd < nfds; fd++ {
		bit := func(set []byte) bool {
			if set == nil {
				return false
			}
			word := binary.NativeEndian.Uint64(set[fd/64*8:])
			return word&(1<<(fd%64)) != 0
		}
		if bit(sets[1]) || bit(sets[2]) {
			return false // it waits to write, or for an exception
		}
		if bit(sets[0]) {
			if !isInput(fd) {
				return false
			}
			found = true
		}
	}
	return found
}

// pollsInput reports whether a poll(fds, nfds) waits for the job's input and for nothing else.
func pollsInput(dir string, addr, nfds uint64, isInput func(uint64) bool) bool {
	if nfds == 0 || nfds > maxWaitFDs {
		return false
	}
	b, ok := readMem(dir, addr, int(nfds)*8) // struct pollfd { int fd; short events, revents; }
	if !ok {
		return false
	}
	found := false
	for k := 0; k < int(nfds); k++ {
		fd := int32(binary.NativeEndian.Uint32(b[k*8:]))
		events := binary.NativeEndian.Uint16(b[k*8+4:])
		if fd < 0 || events == 0 {
			continue // poll ignores it
		}
		if !isInput(uint64(fd)) {
			return false
		}
		found = true
	}
	return found
}

// readMem reads n bytes of a process's memory at addr.
func readMem(dir string, addr uint64, n int) ([]byte, bool) {
	f, err := os.Open(dir + "/mem")
	if err != nil {
		return nil, false
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, int64(addr)); err != nil {
		return nil, false
	}
	return b, true
}

// listening lists the TCP addresses that sockets of pids listen on: the socket inodes in their
// /proc/PID/fd, matched against the LISTEN entries of /proc/PID/net/tcp and tcp6, read once per
// network namespace.
func listening(pids []int) ([]netip.AddrPort, error) {
	sockets := map[uint64]bool{}
	netns := map[string]int{} // namespace → a pid in it
	for _, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid)
		entries, err := os.ReadDir(dir + "/fd")
		if err != nil {
			continue // gone, or a kernel thread
		}
		for _, e := range entries {
			link, err := os.Readlink(dir + "/fd/" + e.Name())
			if err != nil {
				continue
			}
			if s, ok := strings.CutPrefix(link, "socket:["); ok {
				if ino, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64); err == nil {
					sockets[ino] = true
				}
			}
		}
		if ns, err := os.Readlink(dir + "/ns/net"); err == nil {
			if _, ok := netns[ns]; !ok {
				netns[ns] = pid
			}
		}
	}
	if len(sockets) == 0 {
		return nil, nil
	}
	var out []netip.AddrPort
	for _, pid := range netns {
		for _, table := range []string{"tcp", "tcp6"} {
			f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/net/" + table)
			if errors.Is(err, fs.ErrNotExist) {
				continue // no IPv6, or the process is gone
			}
			if err != nil {
				return nil, err
			}
			found, err := listeners(f, sockets)
			f.Close()
			if err != nil {
				return nil, fmt.Errorf("read /proc/%d/net/%s: %w", pid, table, err)
			}
			out = append(out, found...)
		}
	}
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return slices.Compact(out), nil
}

// tcpListen is the state of a listening socket in /proc/net/tcp.
const tcpListen = "0A"

// listeners parses a /proc/net/tcp or tcp6 table, returning the local addresses of the listening
// sockets among sockets (by inode).
func listeners(f *os.File, sockets map[uint64]bool) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	err := eachListener(f, func(ino uint64, addr string) {
		if !sockets[ino] {
			return
		}
		if ap, ok := parseProcAddr(addr); ok {
			out = append(out, ap)
		}
	})
	return out, err
}

// eachListener calls f with the inode and local address of each listening socket of a /proc/net/tcp
// or tcp6 table.
func eachListener(r io.Reader, f func(ino uint64, addr string)) error {
	sc := bufio.NewScanner(r)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != tcpListen {
			continue
		}
		if ino, err := strconv.ParseUint(fields[9], 10, 64); err == nil {
			f(ino, fields[1])
		}
	}
	return sc.Err()
}

// parseProcAddr parses a /proc/net/tcp{,6} address, "0100007F:1435": the address as 32-bit words
// of hex, each in the host's byte order, then the port in hex.
func parseProcAddr(s string) (netip.AddrPort, bool) {
	h, p, ok := strings.Cut(s, ":")
	if !ok || (len(h) != 8 && len(h) != 32) {
		return netip.AddrPort{}, false
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	raw, err := hex.DecodeString(h)
	if err != nil {
		return netip.AddrPort{}, false
	}
	ip := make([]byte, len(raw))
	for k := 0; k < len(raw); k += 4 {
		binary.NativeEndian.PutUint32(ip[k:], binary.BigEndian.Uint32(raw[k:]))
	}
	addr, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), true
}

// ListenDigest is a digest of the set of listening TCP sockets (by inode) in this process's network
// namespace, /proc/self/net/tcp and tcp6: it changes when a socket starts or stops listening there.
// Jobs that are not readonly share the runner's namespace, so a job that begins or stops listening
// changes it; a caller may skip looking at a job without input (Activity) while it does not change.
func ListenDigest() (uint64, error) {
	var sum uint64
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open("/proc/self/net/" + table)
		if errors.Is(err, fs.ErrNotExist) {
			continue // no IPv6
		}
		if err != nil {
			return 0, err
		}
		d, err := listenSum(f)
		f.Close()
		sum += d
		if err != nil {
			return 0, fmt.Errorf("read /proc/self/net/%s: %w", table, err)
		}
	}
	return sum, nil
}

// listenSum is the digest of one /proc/net/tcp or tcp6 table: the sum of its listening sockets'
// inodes, each mixed.
func listenSum(r io.Reader) (uint64, error) {
	var sum uint64
	err := eachListener(r, func(ino uint64, _ string) { sum += mix(ino) })
	return sum, err
}

// mix is splitmix64's finaliser: a sum of mixed inodes does not depend on their order and seldom
// collides.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}
