package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/coordinatortest"
	"github.com/sbx-dev/sbx/coordinator/store"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
)

// clock is a settable Now.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newService(t *testing.T, clk *clock) *coordinator.Service {
	t.Helper()
	return newServiceWith(t, coordinator.Config{Now: clk.Now, CheckInterval: 5 * time.Millisecond})
}

// newServiceWith runs a Service with cfg on a fresh store until the test ends.
func newServiceWith(t *testing.T, cfg coordinator.Config) *coordinator.Service {
	t.Helper()
	return newServiceDisp(t, cfg, &coordinatortest.Dispatcher{})
}

// newServiceDisp is newServiceWith with the dispatcher d.
func newServiceDisp(t *testing.T, cfg coordinator.Config, d *coordinatortest.Dispatcher) *coordinator.Service {
	t.Helper()
	dir := t.TempDir()
	db, err := store.Open(filepath.Join(dir, "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	terms, err := store.OpenTerminals(filepath.Join(dir, "terminals"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { terms.Close() })
	svc, err := coordinator.New(t.Context(), cfg, db, terms, d)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return svc
}

func event(kind, job string, at time.Time) *coordinator.Event {
	return &coordinator.Event{Kind: kind, JobID: job, Runner: "r1", Time: at, Pid: 7}
}

func heartbeat(boot time.Time) *coordinator.Heartbeat {
	return &coordinator.Heartbeat{Runner: "r1", Pool: "default", Slots: 1, Boot: boot}
}

// TestLost: a job is lost when its runner restarts, when its runner falls silent, or when it was
// taken and never started.
func TestLost(t *testing.T) {
	tests := []struct {
		name  string
		setup func(svc *coordinator.Service, clk *clock, id string)
	}{
		{"runner restarted", func(svc *coordinator.Service, clk *clock, id string) {
			boot := clk.Now()
			svc.HandleHeartbeat(heartbeat(boot))
			svc.HandleEvent(context.Background(), coordinatortest.Claimed(svc, event(proto.EventAccepted, id, clk.Now())))
			svc.HandleEvent(context.Background(), coordinatortest.Claimed(svc, event(proto.EventStarted, id, clk.Now())))
			clk.advance(time.Second)
			svc.HandleHeartbeat(heartbeat(clk.Now()))
		}},
		{"runner silent", func(svc *coordinator.Service, clk *clock, id string) {
			svc.HandleHeartbeat(heartbeat(clk.Now()))
			svc.HandleEvent(context.Background(), coordinatortest.Claimed(svc, event(proto.EventAccepted, id, clk.Now())))
			svc.HandleEvent(context.Background(), coordinatortest.Claimed(svc, event(proto.EventStarted, id, clk.Now())))
			clk.advance(16 * time.Second)
		}},
		{"never started", func(svc *coordinator.Service, clk *clock, id string) {
			boot := clk.Now()
			svc.HandleHeartbeat(heartbeat(boot))
			svc.HandleEvent(context.Background(), coordinatortest.Claimed(svc, event(proto.EventAccepted, id, clk.Now())))
			for range 7 { // the runner keeps beating, but the start never comes
				clk.advance(10 * time.Second)
				svc.HandleHeartbeat(heartbeat(boot))
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &clock{now: time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)}
			svc := newService(t, clk)
			res, err := svc.Start(t.Context(), coordinator.StartRequest{Command: "sleep 100", Cwd: "/"})
			if err != nil {
				t.Fatal(err)
			}
			tt.setup(svc, clk, res.Job.ID)
			w, err := svc.Wait(t.Context(), res.Job.ID, 5*time.Second, nil)
			if err != nil || !w.Done || w.Job.Status != coordinator.StatusAborted || w.Job.Reason != proto.ReasonLost {
				t.Fatalf("got %+v, %v; want aborted, lost", w, err)
			}
		})
	}
}

// TestExitWaitsForOutput: an exit that arrives before its last chunk is retried until the chunk is in.
func TestExitWaitsForOutput(t *testing.T) {
	clk := &clock{now: time.Now()}
	svc := newService(t, clk)
	ctx := t.Context()
	res, _ := svc.Start(ctx, coordinator.StartRequest{Command: "echo", Cwd: "/"})
	id := res.Job.ID
	svc.HandleEvent(ctx, coordinatortest.Claimed(svc, event(proto.EventStarted, id, clk.Now())))
	if err := svc.HandleChunk(ctx, coordinatortest.ClaimedChunk(svc, &coordinator.Chunk{JobID: id, Offset: 3, Data: []byte("def")})); err != nil {
		t.Fatal(err)
	}
	if j, _ := svc.Job(ctx, id); j.OutputBytes != 0 {
		t.Fatalf("output_bytes %d counts past a gap", j.OutputBytes)
	}
	code := 0
	exit := &coordinator.Event{Kind: proto.EventExited, JobID: id, Runner: "r1", Time: clk.Now(), ExitCode: &code, Reason: proto.ReasonExit, OutputBytes: 6}
	if err := svc.HandleEvent(ctx, coordinatortest.Claimed(svc, exit)); !errors.Is(err, coordinator.ErrNotReady) {
		t.Fatalf("exit before the output is whole: %v, want ErrNotReady", err)
	}
	if err := svc.HandleChunk(ctx, coordinatortest.ClaimedChunk(svc, &coordinator.Chunk{JobID: id, Offset: 0, Data: []byte("abc")})); err != nil {
		t.Fatal(err)
	}
	if err := svc.HandleEvent(ctx, coordinatortest.Claimed(svc, exit)); err != nil {
		t.Fatal(err)
	}
	j, _ := svc.Job(ctx, id)
	if j.Status != coordinator.StatusSucceeded || j.OutputBytes != 6 {
		t.Fatalf("job %+v", j)
	}
}

// TestWaitPatternAcrossChunks: a pattern split over two chunks, and anchored at a line start, matches.
func TestWaitPatternAcrossChunks(t *testing.T) {
	clk := &clock{now: time.Now()}
	svc := newService(t, clk)
	ctx := t.Context()
	res, _ := svc.Start(ctx, coordinator.StartRequest{Command: "echo", Cwd: "/"})
	id := res.Job.ID
	svc.HandleEvent(ctx, coordinatortest.Claimed(svc, event(proto.EventStarted, id, clk.Now())))
	re := regexp.MustCompile(`(?m)^ready on port \d+$`)
	go func() {
		svc.HandleChunk(ctx, coordinatortest.ClaimedChunk(svc, &coordinator.Chunk{JobID: id, Offset: 0, Data: []byte("booting\nready on po")}))
		// The second half comes while the wait waits (were it not counted in 5 s, the wait would
		// still find both halves).
		poll.Within(5*time.Second, func() bool { return svc.Observers(id) == 1 })
		svc.HandleChunk(ctx, coordinatortest.ClaimedChunk(svc, &coordinator.Chunk{JobID: id, Offset: 19, Data: []byte("rt 8080\n")}))
	}()
	w, err := svc.Wait(ctx, id, 5*time.Second, re)
	if err != nil || !w.PatternMatched || w.Done || w.Matched != "ready on port 8080" || w.MatchedOffset != 8 {
		t.Fatalf("wait: %+v, %v", w, err)
	}
	w, err = svc.Wait(ctx, id, 50*time.Millisecond, regexp.MustCompile("never"))
	if err != nil || w.PatternMatched || w.Done {
		t.Fatalf("wait for a pattern that never comes: %+v, %v", w, err)
	}
}

// TestQueuedReason: a queued job says what keeps it from starting — no runner, every slot busy —
// and says nothing once a free slot can take it or a runner has.
func TestQueuedReason(t *testing.T) {
	clk := &clock{now: time.Now()}
	svc := newService(t, clk)
	res, err := svc.Start(t.Context(), coordinator.StartRequest{Command: "echo hi", Cwd: "/"})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Job.ID
	reason := func() string {
		t.Helper()
		j, err := svc.Job(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		return j.QueuedReason
	}
	if r := res.Job.QueuedReason; r != "No runner of pool default is connected; the job starts when one joins." {
		t.Errorf("without runners: %q", r)
	}
	hb := heartbeat(clk.Now())
	hb.Slots, hb.Running = 2, 2
	svc.HandleHeartbeat(hb)
	if r := reason(); r != "Every slot of pool default is busy (2 of 2 on 1 runners); the job starts when one frees." {
		t.Errorf("all slots busy: %q", r)
	}
	hb.Running = 1
	svc.HandleHeartbeat(hb)
	if r := reason(); r != "" {
		t.Errorf("a free slot: %q, want none", r)
	}
	hb.Running = 2
	svc.HandleHeartbeat(hb)
	if err := svc.HandleEvent(t.Context(), coordinatortest.Claimed(svc, event(proto.EventAccepted, id, clk.Now()))); err != nil {
		t.Fatal(err)
	}
	if r := reason(); r != "" {
		t.Errorf("taken: %q, want none", r)
	}
}

// TestWaitScansIncrementally: waits for a pattern read each byte of output about once, however many
// calls there are: a later wait carries on where the previous one stopped, with a bounded
// carry-over. Each call once read the whole output again (5.8 s of CPU on 300 MB).
func TestWaitScansIncrementally(t *testing.T) {
	clk := &clock{now: time.Now()}
	svc := newService(t, clk)
	ctx := t.Context()
	res, _ := svc.Start(ctx, coordinator.StartRequest{Command: "seq", Cwd: "/"})
	id := res.Job.ID
	svc.HandleEvent(ctx, coordinatortest.Claimed(svc, event(proto.EventStarted, id, clk.Now())))
	var out []byte
	for i := range 120_000 {
		out = fmt.Appendf(out, "line %07d\n", i)
	}
	size := int64(0)
	write := func(data []byte) {
		t.Helper()
		for len(data) > 0 {
			n := min(len(data), 64<<10)
			if err := svc.HandleChunk(ctx, coordinatortest.ClaimedChunk(svc, &coordinator.Chunk{JobID: id, Offset: size, Data: data[:n]})); err != nil {
				t.Fatal(err)
			}
			data, size = data[n:], size+int64(n)
		}
	}
	write(out)
	scanned := func() int64 { return svc.Stats().ScannedBytes }
	wait := func(pattern string) *coordinator.WaitResult {
		t.Helper()
		w, err := svc.Wait(ctx, id, 0, regexp.MustCompile("(?m)"+pattern))
		if err != nil {
			t.Fatal(err)
		}
		return w
	}

	// The first wait reads everything once, window by window, each overlapping the previous one.
	if w := wait(`^ready$`); w.PatternMatched {
		t.Fatalf("matched %q", w.Matched)
	}
	first := scanned()
	if first < size || first > size+size/4 {
		t.Fatalf("the first wait read %d bytes of %d", first, size)
	}
	// Eight more waits for the same pattern read nothing: nothing is new.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { wait(`^ready$`) })
	}
	wg.Wait()
	if n := scanned() - first; n != 0 {
		t.Fatalf("8 waits over unchanged output read %d bytes, want 0", n)
	}
	// New output is read with at most the carry-over before it, and a line split between two
	// waits still matches.
	write([]byte("rea"))
	if w := wait(`^ready$`); w.PatternMatched {
		t.Fatalf("matched %q before the line was whole", w.Matched)
	}
	before := scanned()
	write([]byte("dy\n"))
	w := wait(`^ready$`)
	if !w.PatternMatched || w.Matched != "ready" || w.MatchedOffset != size-6 {
		t.Fatalf("wait: %+v", w)
	}
	if n := scanned() - before; n > 64<<10+3 {
		t.Fatalf("a wait after 3 new bytes read %d bytes, more than the 64 KiB carry-over", n)
	}
	// The match is kept: asking again reads nothing.
	before = scanned()
	if w := wait(`^ready$`); !w.PatternMatched || w.MatchedOffset != size-6 {
		t.Fatalf("second wait: %+v", w)
	}
	if n := scanned() - before; n != 0 {
		t.Fatalf("a wait whose pattern had matched read %d bytes", n)
	}
	// A pattern matched deep in the output, past the first window, is found at its offset.
	if w := wait(`^line 0100000$`); !w.PatternMatched || w.MatchedOffset != 100_000*13 {
		t.Fatalf("wait for a line past the first window: %+v", w)
	}
}

// TestOutputBudget: the output of all jobs together is bounded. The job that writes past the budget
// is stopped (reason output_limit) while the others go on, new jobs are refused with
// output_budget_exhausted until retention frees room, and a data disk short of free space refuses
// them with disk_low. Only per-job caps existed: 256 slots of 1 GiB each.
func TestOutputBudget(t *testing.T) {
	// open runs a service with the budget and returns its start and write helpers and its dispatcher.
	open := func(t *testing.T, cfg coordinator.Config) (*coordinator.Service, func() (string, error), func(string, int, int), *coordinatortest.Dispatcher) {
		d := &coordinatortest.Dispatcher{}
		svc := newServiceDisp(t, cfg, d)
		ctx := t.Context()
		start := func() (string, error) {
			res, err := svc.Start(ctx, coordinator.StartRequest{Command: "yes", Cwd: "/"})
			if err != nil {
				return "", err
			}
			svc.HandleEvent(ctx, coordinatortest.Claimed(svc, event(proto.EventStarted, res.Job.ID, time.Now())))
			return res.Job.ID, nil
		}
		write := func(id string, off int, n int) {
			t.Helper()
			if err := svc.HandleChunk(ctx, coordinatortest.ClaimedChunk(svc, &coordinator.Chunk{JobID: id, Offset: int64(off), Data: make([]byte, n)})); err != nil {
				t.Fatal(err)
			}
		}
		return svc, start, write, d
	}
	killed := func(d *coordinatortest.Dispatcher, id string) bool {
		return slices.Contains(d.Kills(), id)
	}
	exit := func(t *testing.T, svc *coordinator.Service, id string, size int64) {
		t.Helper()
		e := event(proto.EventExited, id, time.Now())
		e.Reason, e.OutputBytes = proto.ReasonKilled, size
		if err := svc.HandleEvent(t.Context(), coordinatortest.Claimed(svc, e)); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("cut and refused", func(t *testing.T) {
		svc, start, write, d := open(t, coordinator.Config{OutputBudget: 1000})
		a, err := start()
		if err != nil {
			t.Fatal(err)
		}
		b, err := start()
		if err != nil {
			t.Fatal(err)
		}
		write(a, 0, 600)
		write(b, 0, 300)
		write(b, 300, 200) // 1100 bytes in all: b wrote past the budget
		poll.Until(t, 10*time.Second, "the job that wrote past the budget is stopped", func() bool { return killed(d, b) })
		if killed(d, a) {
			t.Error("a job that wrote within the budget was stopped")
		}
		if _, err := start(); coordinator.ErrorCode(err) != coordinator.EOUTPUTBUDGET {
			t.Fatalf("a start past the budget: %v, want %s", err, coordinator.EOUTPUTBUDGET)
		}
		exit(t, svc, b, 500)
		if j, _ := svc.Job(t.Context(), b); j.Reason != proto.ReasonOutputLimit || !strings.Contains(j.Error, "--output-budget") {
			t.Errorf("the stopped job ended with reason %q, error %q; want output_limit naming the budget", j.Reason, j.Error)
		}
		// Ended jobs' output counts too, until retention removes it.
		if _, err := start(); coordinator.ErrorCode(err) != coordinator.EOUTPUTBUDGET {
			t.Fatalf("a start past the budget, the writer ended: %v, want %s", err, coordinator.EOUTPUTBUDGET)
		}
	})

	t.Run("retention frees room", func(t *testing.T) {
		svc, start, write, _ := open(t, coordinator.Config{OutputBudget: 1000, RetainBytes: 100, RetentionInterval: 10 * time.Millisecond})
		a, err := start()
		if err != nil {
			t.Fatal(err)
		}
		write(a, 0, 1100)
		exit(t, svc, a, 1100)
		poll.Within(10*time.Second, func() bool {
			_, err = start()
			return coordinator.ErrorCode(err) != coordinator.EOUTPUTBUDGET
		})
		if err != nil {
			t.Fatalf("start after retention freed room: %v", err)
		}
	})

	t.Run("disk low", func(t *testing.T) {
		svc := newServiceWith(t, coordinator.Config{MinFreeBytes: 1 << 62})
		_, err := svc.Start(t.Context(), coordinator.StartRequest{Command: "true", Cwd: "/"})
		if coordinator.ErrorCode(err) != coordinator.EDISKLOW || !strings.Contains(err.Error(), "--min-free-disk") {
			t.Fatalf("start on a disk short of free space: %v, want %s", err, coordinator.EDISKLOW)
		}
	})
}
