package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
)

// Moving a process into a v1 cgroup takes the kernel's cgroup threadgroup lock for writing, which
// waits for an RCU grace period: about 5 ms, on every job's start. A warm init step pays it before
// the job arrives: it is the init step (init.go) started into a spare cgroup (warm-<id>-<n>), where
// its C constructor joins the cgroup and then waits on jobFD for the job. Start takes one, applies
// the job's limits, renames the cgroup to the job's id (v1 allows renaming a cgroup; its processes
// stay), and sends the job; the init step runs it. A new one is made in the background. The job
// still starts already inside its cgroup, as on the cold path.
const (
	// defaultWarm is how many warm init steps a v1 Manager keeps.
	defaultWarm = 4
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
	name string   // its cgroup's name under the root until a job claims it
	p    *Process // the init step, which becomes the job
	job  *os.File // write end of its job pipe
	// seccomp is whether it holds the readonly program on seccompFD (readonly jobs are possible here).
	seccomp bool
	// env is the empty file it holds on argsFD, for a readonly job's environment (bwrapEnv); nil
	// without seccomp.
	env *os.File
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
	// The readonly program, when readonly jobs can run here: a step cannot know its job's kind. With
	// it an empty file for the environment of a readonly job, which claim fills in: the runner keeps
	// the file, so it can write what the step's bwrap will read.
	var prog, env *os.File
	if ro, err := m.ro.get(m.bwrap); err == nil {
		prog, _ = ro.program() // without it the step serves plain jobs only
	}
	if prog != nil {
		if env, err = memfd("sbx-bwrap-env"); err != nil {
			prog.Close()
			prog, env = nil, nil
		}
	}
	files := make([]*os.File, argsFD-3) // descriptors 4..argsFD
	files[seccompFD-4], files[jobFD-4], files[argsFD-4] = prog, jr, env
	p, err := start(g, Spec{}, files, m.grace, release, g.prepare)
	// The step has its own copies once started.
	jr.Close()
	if prog != nil {
		prog.Close()
	}
	if err != nil {
		jw.Close()
		if env != nil {
			env.Close()
		}
		return nil, err
	}
	return &warmProc{name: name, p: p, job: jw, seccomp: prog != nil, env: env}, nil
}

// discard ends a warm init step no job will use; its Process removes its cgroup.
func (w *warmProc) discard() {
	w.job.Close() // the init step reads EOF, finds no job and exits
	w.closeEnv()
	_, _ = w.p.Wait()
}

// closeEnv closes the runner's copy of the step's environment file.
func (w *warmProc) closeEnv() {
	if w.env != nil {
		w.env.Close()
		w.env = nil
	}
}

// claim makes the warm init step run spec (bwrap already, for a readonly job, which keeps the
// step's seccompFD and finds env, its environment for bwrap, on argsFD): it applies l, renames the
// cgroup to spec.ID and sends the job. release is the job's: the Process calls it when the job is over, or claim does when it
// fails before the Process has it. errWarmGone means the step had died: spec.ID stays live for the
// cold start that follows.
func (w *warmProc) claim(h *v1Hierarchy, spec Spec, readonly bool, env []byte, l limits, release func()) (*Process, error) {
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
	if readonly {
		// What Activity knows of a readonly job, as start sets it for a cold one.
		p.readonly, p.supervisor = true, spec.Path
	}
	p.mu.Unlock()
	warmRelease() // the Manager forgets the spare name; the job's id is live
	if err := g.cg.Update(res); err != nil {
		return fail(fmt.Errorf("apply limits: %w", err))
	}
	// The step joined its cgroup when it was made: the cgroup is the job's from now on.
	p.mu.Lock()
	p.stages.Cgroup = Monotonic()
	p.mu.Unlock()
	if readonly {
		// At offset 0 without moving the shared offset, from which bwrap reads.
		if _, err := w.env.WriteAt(env, 0); err != nil {
			return fail(fmt.Errorf("write the job's environment: %w", err))
		}
	}
	w.closeEnv()
	// A failed write means the step died, which launched reports.
	_, _ = w.job.Write(jobMessage(spec, readonly))
	w.job.Close()
	if err := <-p.launched; err != nil {
		p.Wait() // the job's id is released with the Process
		return nil, err
	}
	return p, nil
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
