package coordinatortest

import (
	"context"
	"sync"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/proto"
)

// Dispatcher is a fake of the coordinator's Dispatcher port that stands in for the runners: it
// numbers and records the work and the control requests it is given and answers each control
// request OK. A test plays a runner's part with SetRun and SetControl, and lets queued work be
// withdrawn with SetWithdraw. The zero value is ready to use.
type Dispatcher struct {
	mu       sync.Mutex
	seq      uint64
	work     []*coordinator.Work
	controls []*coordinator.Control
	run      func(*coordinator.Work)
	control  func(ctx context.Context, runner string, c *coordinator.Control) error
	withdraw bool
}

// Dispatch records w and calls the run set, outside the lock: it may play the job's events back
// into the service, which may dispatch again.
func (d *Dispatcher) Dispatch(_ context.Context, w *coordinator.Work) (uint64, error) {
	d.mu.Lock()
	d.seq++
	seq, run := d.seq, d.run
	d.work = append(d.work, w)
	d.mu.Unlock()
	if run != nil {
		run(w)
	}
	return seq, nil
}

// Withdraw reports what SetWithdraw set: false, the work already taken, unless a test says otherwise.
func (d *Dispatcher) Withdraw(context.Context, uint64) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.withdraw, nil
}

// Control records c and calls the control set, outside the lock, whose error it returns.
func (d *Dispatcher) Control(ctx context.Context, runner string, c *coordinator.Control) (*coordinator.ControlReply, error) {
	d.mu.Lock()
	d.controls = append(d.controls, c)
	control := d.control
	d.mu.Unlock()
	var err error
	if control != nil {
		err = control(ctx, runner, c)
	}
	return &coordinator.ControlReply{Code: proto.ReplyOK}, err
}

// SetRun makes every later Dispatch call run with its work.
func (d *Dispatcher) SetRun(run func(*coordinator.Work)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.run = run
}

// SetControl makes every later Control call control with its request.
func (d *Dispatcher) SetControl(control func(ctx context.Context, runner string, c *coordinator.Control) error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.control = control
}

// SetWithdraw sets whether queued work can be withdrawn.
func (d *Dispatcher) SetWithdraw(ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.withdraw = ok
}

// Works is the work dispatched so far, in order.
func (d *Dispatcher) Works() []*coordinator.Work {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*coordinator.Work(nil), d.work...)
}

// Controls is the control requests sent so far, in order.
func (d *Dispatcher) Controls() []*coordinator.Control {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*coordinator.Control(nil), d.controls...)
}

// Kills is the jobs a kill was sent for so far, in order.
func (d *Dispatcher) Kills() []string {
	var ids []string
	for _, c := range d.Controls() {
		if c.Op == proto.OpKill {
			ids = append(ids, c.JobID)
		}
	}
	return ids
}
