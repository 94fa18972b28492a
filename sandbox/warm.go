package sandbox

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
)

// Moving a process into a v1 cgroup takes the kernel's cgroup threadgroup lock for writing, which
// waits for an RCU grace period: about 5 ms, on every job's start. A warm init step pays it before
// the job arrives: it is this binary re-executed as warmArg0 into a spare cgroup (warm-<id>-<n>), where its
// C constructor joins the cgroup and then waits on jobFD for the job. Start takes one, applies the
// job's limits, renames the cgroup to the job's id (v1 allows renaming a cgroup; its processes stay),
// and sends the program, directory and environment; the init step execs it. A new one is made in the
// background. The job still starts already inside its cgroup, as on the cold path.
const (
	warmArg0 = "sbx-init-warm"
	// jobFD is where a warm init step reads its job (warmMessage); statusFD reports as for the cold
	// one, and seccompFD holds the readonly program, for a readonly job.
	jobFD = seccompFD + 1
	// defaultWarm is how many warm init steps a v1 Manager keeps.
	defaultWarm = 4
	// warmJoined is the byte a warm init step writes on its status pipe once it joined its cgroup.
	warmJoined = '+'
)

// errWarmGone means a warm init step died before a job could use it; Start goes the cold way.
var errWarmGone = errors.New("sandbox: warm init step gone")

// warmPool keeps up to its capacity of warm init steps.
type warmPool struct {
	m     *Manager
	h     *v1Hierarchy
	ready chan *warmProc
	// prefix makes this pool's cgroup names unique among Managers sharing a root.
	prefix string
	seq    atomic.Int64

	mu      sync.Mutex
	closed  bool
	pending int            // steps being made
	making  sync.WaitGroup // the goroutines of refill
}

// warmProc is one warm init step.
type warmProc struct {
	name   string   // its cgroup's name under the root until a job claims it
	p      *Process // the init step, which becomes the job
	job    *os.File // write end of its job pipe
	status *os.File // read end of its status pipe
	// seccomp is whether it holds the readonly program on seccompFD (readonly jobs are possible here).
	seccomp bool
}

func newWarmPool(m *Manager, h *v1Hierarchy, size int) *warmPool {
	b := make([]byte, 4)
	rand.Read(b)
	wp := &warmPool{m: m, h: h, ready: make(chan *warmProc, size), prefix: "warm-" + hex.EncodeToString(b) + "-"}
	wp.refill()
	return wp
}

// refill tops the pool up in the background once half of it is taken, making the missing steps
// together: moves into v1 cgroups made close together share one grace period, so a batch of n costs
// about what one does. A step that cannot be made is not retried: Start takes the cold way instead.
func (wp *warmPool) refill() {
	wp.mu.Lock()
	defer wp.mu.Unlock()
	have := len(wp.ready) + wp.pending
	if wp.closed || have > cap(wp.ready)/2 {
		return
	}
	for ; have < cap(wp.ready); have++ {
		wp.pending++
		wp.making.Add(1)
		go func() {
			defer wp.making.Done()
			w, err := wp.make()
			if err == nil {
				// Never blocks: ready and pending together stay within the capacity.
				wp.ready <- w
			}
			wp.mu.Lock()
			wp.pending--
			wp.mu.Unlock()
		}()
	}
}

// take returns a warm init step, or nil when none is ready. The caller refills once the job has
// started: a v1 cgroup move blocks every fork and exec on the machine while it waits for its grace
// period, so a refill racing the job's exec would cost the job what the warm step saved.
func (wp *warmPool) take() *warmProc {
	select {
	case w := <-wp.ready:
		return w
	default:
		return nil
	}
}

// close stops refilling and ends every warm init step, waiting until their cgroups are gone.
func (wp *warmPool) close() {
	wp.mu.Lock()
	wp.closed = true
	wp.mu.Unlock()
	wp.making.Wait()
	for {
		select {
		case w := <-wp.ready:
			w.discard()
		default:
			return
		}
	}
}

// make starts a warm init step in a new spare cgroup.
func (wp *warmPool) make() (*warmProc, error) {
	m := wp.m
	name := wp.prefix + strconv.FormatInt(wp.seq.Add(1), 10)
	m.mu.Lock()
	m.live[name] = true // Sweep spares it
	m.mu.Unlock()
	release := func() {
		m.mu.Lock()
		delete(m.live, name)
		m.mu.Unlock()
	}
	g, err := wp.h.create(name, limits{})
	if err != nil {
		release()
		return nil, err
	}
	jr, jw, err := os.Pipe()
	if err != nil {
		release()
		return nil, errors.Join(fmt.Errorf("job pipe: %w", err), g.remove())
	}
	sr, sw, err := os.Pipe()
	if err != nil {
		jr.Close()
		jw.Close()
		release()
		return nil, errors.Join(fmt.Errorf("status pipe: %w", err), g.remove())
	}
	// The readonly program, when readonly jobs can run here: a step cannot know its job's kind.
	var prog *os.File
	if ro, err := m.ro.get(m.bwrap); err == nil {
		prog, _ = ro.program() // without it the step serves plain jobs only
	}
	vg := g.(*v1Group)
	args := []string{warmArg0, strconv.Itoa(len(vg.dirs))}
	for _, dir := range vg.dirs {
		args = append(args, filepath.Join(dir, "cgroup.procs"))
	}
	spec := Spec{Path: "/proc/self/exe", Args: args, Dir: "/", Env: []string{}}
	prepare := func(cmd *exec.Cmd) (func(error) error, error) {
		files := make([]*os.File, jobFD-2) // descriptors 3..jobFD
		files[statusFD-3], files[seccompFD-3], files[jobFD-3] = sw, prog, jr
		cmd.ExtraFiles = files
		return func(err error) error {
			sw.Close()
			jr.Close()
			if prog != nil {
				prog.Close()
			}
			return err
		}, nil
	}
	p, err := start(g, spec, nil, m.grace, release, prepare)
	if err != nil {
		jw.Close()
		sr.Close()
		return nil, err
	}
	w := &warmProc{name: name, p: p, job: jw, status: sr, seccomp: prog != nil}
	// Ready means joined: the init step says so with one byte before it waits for the job.
	joined := make([]byte, 1)
	if _, err := io.ReadFull(sr, joined); err != nil || joined[0] != warmJoined {
		w.discard()
		return nil, fmt.Errorf("warm init step did not join its cgroup: %v", err)
	}
	return w, nil
}

// discard ends a warm init step no job will use; its Process removes its cgroup.
func (w *warmProc) discard() {
	w.job.Close() // the init step reads EOF, finds no job and exits
	w.status.Close()
	_, _ = w.p.Wait()
}

// claim makes the warm init step run spec (bwrap already, for a readonly job, which keeps the
// step's seccompFD): it applies l, renames the cgroup to spec.ID and sends
// the job. release is the job's: the Process calls it when the job is over, or claim does when it
// fails before the Process has it. errWarmGone means the step had died: spec.ID stays live for the
// cold start that follows.
func (w *warmProc) claim(h *v1Hierarchy, spec Spec, readonly bool, l limits, release func()) (*Process, error) {
	p := w.p
	early := func(err error) (*Process, error) {
		w.discard()
		if !errors.Is(err, errWarmGone) {
			release()
		}
		return nil, err
	}
	fail := func(err error) (*Process, error) {
		w.discard()
		return nil, err
	}
	res, err := h.resources(l)
	if err != nil {
		return early(err)
	}
	p.mu.Lock()
	if p.exited {
		p.mu.Unlock()
		return early(errWarmGone)
	}
	g, err := h.rename(w.name, spec.ID)
	if err != nil {
		p.mu.Unlock()
		return early(err)
	}
	warmRelease := p.release
	p.g, p.release, p.linger, p.lingerCgroup = g, release, spec.Linger, spec.LingerCgroup
	p.mu.Unlock()
	warmRelease() // the Manager forgets the spare name; the job's id is live
	if err := g.cg.Update(res); err != nil {
		return fail(fmt.Errorf("apply limits: %w", err))
	}
	_, werr := w.job.Write(warmMessage(spec, readonly))
	w.job.Close()
	msg, rerr := io.ReadAll(w.status)
	w.status.Close()
	switch {
	case len(msg) > 0:
		return fail(errors.New(string(msg)))
	case werr != nil:
		return fail(fmt.Errorf("send job to init step: %w", werr))
	case rerr != nil:
		return fail(fmt.Errorf("read init status: %w", rerr))
	}
	return p, nil
}

// warmMessage is the job a warm init step execs: NUL-terminated fields seccomp ("1" keeps seccompFD
// open for bwrap), credential (Credential.String), dir, path, argc, argv..., envc, env... (Spec.validate refuses NUL bytes in all).
func warmMessage(spec Spec, readonly bool) []byte {
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
	if readonly {
		field("1")
	} else {
		field("0")
	}
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

// rename renames the job cgroup from to to in every hierarchy; on failure it renames back what it
// had renamed.
func (h *v1Hierarchy) rename(from, to string) (*v1Group, error) {
	var done []string
	undo := func(err error) (*v1Group, error) {
		for _, parent := range done {
			_ = os.Rename(filepath.Join(parent, to), filepath.Join(parent, from)) // best effort: err matters
		}
		return nil, err
	}
	for _, mp := range distinct(h.mounts) {
		parent := filepath.Join(mp, h.root)
		if exists(filepath.Join(parent, to)) {
			return undo(fmt.Errorf("%w: %s", ErrJobExists, filepath.Join(parent, to)))
		}
		if err := os.Rename(filepath.Join(parent, from), filepath.Join(parent, to)); err != nil {
			return undo(fmt.Errorf("rename cgroup: %w", err))
		}
		done = append(done, parent)
	}
	g, err := h.open(to)
	if err != nil {
		return undo(err)
	}
	return g.(*v1Group), nil
}
