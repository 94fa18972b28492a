package sandbox

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

var (
	// ErrInvalidSpec reports a Spec that Start refuses.
	ErrInvalidSpec = errors.New("sandbox: invalid spec")
	// ErrUnsupported reports a resource setting sandbox does not enforce; Start fails rather than run
	// the job without it.
	ErrUnsupported = errors.New("sandbox: unsupported resource")
)

// maxIDLen bounds a job id, which is also a cgroup directory name.
const maxIDLen = 64

// Spec describes one job's command.
type Spec struct {
	// ID names the job's cgroup under Root: [A-Za-z0-9_-]{1,64}.
	ID string
	// Path is the absolute path of the program, e.g. "/bin/sh".
	Path string
	// Args is argv including argv[0], e.g. {"sh", "-c", "echo hi"}; empty means {Path}.
	Args []string
	// Dir is the absolute working directory; empty means "/".
	Dir string
	// Env is the exact environment; nothing is inherited from the runner.
	Env []string
	// Readonly runs the program inside bwrap with the readonly seccomp filter: nothing writable, no
	// network, no AF_UNIX socket, no io_uring, no foreign syscall ABI, no capabilities (bwrapArgs,
	// readonlyFilter). Start fails rather than run it any other way.
	Readonly bool
	// Stdin gives the job a pipe as its standard input (Process.Input); without it, /dev/null. A job
	// with input always starts cold (warm init steps have /dev/null already).
	Stdin bool
	// SeparateStderr gives standard error a pipe of its own (Process.Errors) instead of sharing
	// standard output's, for a caller that treats the two apart (a monitor reads stdout lines only).
	// The order between the two is then only the order they are read in. Such a job starts cold
	// (warm init steps have the shared pipe already).
	SeparateStderr bool
	// TTY runs the program on a new pseudo-terminal of TTYSize, in a session of its own with the
	// terminal as its controlling terminal: Output is what the terminal shows (stdout and stderr,
	// echoed input, with the terminal's line discipline: "\n" becomes "\r\n"), Input is typed on it
	// and Resize changes its size. A readonly job's command has it as its descriptors 0-2 but not as
	// controlling terminal (bwrap's --new-session), so it cannot push input into it with TIOCSTI.
	// SeparateStderr does not apply; such a job starts cold.
	TTY     bool
	TTYSize TTYSize
	// Linger keeps the job going after its main process exits, until its output closes: until every
	// process holding the pipe (a background child printing) has exited or closed it. Without it,
	// whatever is left in the cgroup is killed when the main process exits.
	Linger bool
	// LingerCgroup keeps the job going after its main process exits until its cgroup is empty:
	// until every process it started has exited, a daemon that redirected its output
	// (`nohup setsid srv >/dev/null 2>&1 &`) included, which Linger does not wait for. The job stays
	// one that can be seen, waited on and killed.
	LingerCgroup bool
	// Credential, when set, is the user and groups the program runs as; nil runs it as the runner.
	// The init step joins the cgroup as the runner (writing cgroup.procs needs its privileges); the
	// job's program drops to the credential before its exec.
	Credential *Credential
	// Resources holds the limits: Memory.Limit and Memory.Swap (memory+swap, as on v1), CPU.Quota and
	// CPU.Period, Pids.Limit. Nil means unset. Any other field set is ErrUnsupported.
	Resources *specs.LinuxResources
}

// Credential names a user by number: uid, primary gid and supplementary groups.
type Credential struct {
	UID    uint32
	GID    uint32
	Groups []uint32
}

// String encodes c for the init step: "uid:gid:g1,g2,..." (no groups: "uid:gid:"); nil is "-".
func (c *Credential) String() string {
	if c == nil {
		return "-"
	}
	var b strings.Builder
	b.WriteString(strconv.FormatUint(uint64(c.UID), 10) + ":" + strconv.FormatUint(uint64(c.GID), 10) + ":")
	for i, g := range c.Groups {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(g), 10))
	}
	return b.String()
}

// parseCredential reverses Credential.String.
func parseCredential(s string) (*Credential, error) {
	if s == "-" {
		return nil, nil
	}
	uid, rest, ok1 := strings.Cut(s, ":")
	gid, groups, ok2 := strings.Cut(rest, ":")
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("credential %q: want uid:gid:groups", s)
	}
	num := func(v string) (uint32, error) {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("credential %q: %w", s, err)
		}
		return uint32(n), nil
	}
	c := &Credential{}
	var err error
	if c.UID, err = num(uid); err != nil {
		return nil, err
	}
	if c.GID, err = num(gid); err != nil {
		return nil, err
	}
	if groups != "" {
		for _, g := range strings.Split(groups, ",") {
			n, err := num(g)
			if err != nil {
				return nil, err
			}
			c.Groups = append(c.Groups, n)
		}
	}
	return c, nil
}

// maxGroups bounds a credential's supplementary groups (the kernel's NGROUPS_MAX is 65536; a user
// in more than this many is a configuration mistake).
const maxGroups = 1024

// limits is the part of specs.LinuxResources that sandbox enforces; nil means unset.
type limits struct {
	memory *int64  // bytes
	swap   *int64  // memory+swap bytes, v1 semantics
	quota  *int64  // µs per period
	period *uint64 // µs
	pids   *int64
}

// validate checks s and extracts its limits.
func (s Spec) validate() (limits, error) {
	if !validID(s.ID) {
		return limits{}, fmt.Errorf("%w: id %q must match [A-Za-z0-9_-]{1,%d}", ErrInvalidSpec, s.ID, maxIDLen)
	}
	if !filepath.IsAbs(s.Path) {
		return limits{}, fmt.Errorf("%w: path %q is not absolute", ErrInvalidSpec, s.Path)
	}
	if s.Dir != "" && !filepath.IsAbs(s.Dir) {
		return limits{}, fmt.Errorf("%w: dir %q is not absolute", ErrInvalidSpec, s.Dir)
	}
	// No argument can hold a NUL: execve could not pass it, and the warm init's message separates
	// fields with it.
	for _, v := range append(append([]string{s.Path, s.Dir}, s.Args...), s.Env...) {
		if strings.IndexByte(v, 0) >= 0 {
			return limits{}, fmt.Errorf("%w: %q contains a NUL byte", ErrInvalidSpec, v)
		}
	}
	if s.TTY && s.SeparateStderr {
		return limits{}, fmt.Errorf("%w: a terminal has one output: tty excludes separate stderr", ErrInvalidSpec)
	}
	if c := s.Credential; c != nil && len(c.Groups) > maxGroups {
		return limits{}, fmt.Errorf("%w: %d supplementary groups, at most %d", ErrInvalidSpec, len(c.Groups), maxGroups)
	}
	return toLimits(s.Resources)
}

func validID(id string) bool {
	if id == "" || len(id) > maxIDLen {
		return false
	}
	for _, c := range id {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// setting names one resource field and whether the spec sets it.
type setting struct {
	name string
	set  bool
}

// toLimits refuses every resource setting it does not carry over, so that a job never runs with less
// confinement than it asked for.
func toLimits(r *specs.LinuxResources) (limits, error) {
	if r == nil {
		return limits{}, nil
	}
	unsupported := []setting{
		{"devices", len(r.Devices) > 0},
		{"blockIO", r.BlockIO != nil},
		{"hugepageLimits", len(r.HugepageLimits) > 0},
		{"network", r.Network != nil},
		{"rdma", len(r.Rdma) > 0},
		{"unified", len(r.Unified) > 0},
	}
	var l limits
	if m := r.Memory; m != nil {
		l.memory, l.swap = m.Limit, m.Swap
		unsupported = append(unsupported, []setting{
			{"memory.reservation", m.Reservation != nil},
			{"memory.kernel", m.Kernel != nil},
			{"memory.kernelTCP", m.KernelTCP != nil},
			{"memory.swappiness", m.Swappiness != nil},
			{"memory.disableOOMKiller", m.DisableOOMKiller != nil},
			{"memory.useHierarchy", m.UseHierarchy != nil},
			{"memory.checkBeforeUpdate", m.CheckBeforeUpdate != nil},
		}...)
	}
	if c := r.CPU; c != nil {
		l.quota, l.period = c.Quota, c.Period
		unsupported = append(unsupported, []setting{
			{"cpu.shares", c.Shares != nil},
			{"cpu.burst", c.Burst != nil},
			{"cpu.realtimeRuntime", c.RealtimeRuntime != nil},
			{"cpu.realtimePeriod", c.RealtimePeriod != nil},
			{"cpu.cpus", c.Cpus != ""},
			{"cpu.mems", c.Mems != ""},
			{"cpu.idle", c.Idle != nil},
		}...)
	}
	if p := r.Pids; p != nil {
		l.pids = p.Limit
	}
	for _, u := range unsupported {
		if u.set {
			return limits{}, fmt.Errorf("%w: %s", ErrUnsupported, u.name)
		}
	}
	return l, nil
}
