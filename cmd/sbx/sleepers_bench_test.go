package main

import (
	"bytes"
	"cmp"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/internal/poll"
)

// BenchmarkSleepingJobs measures what a sleeping job costs: `sbx coordinator` and `sbx runner --slots
// N`, each a process of its own over one NATS server (in this process), first with no job, then with N
// `sleep 3600` jobs all running (SBX_BENCH_SLEEPERS, 10000 by default). It reports each process's
// resident memory per job (the difference of VmRSS over N, in KiB), the runner's descriptors per job,
// its OS threads at 0 and at N jobs,
// and its CPU (% of one CPU) over an idle window of 10 s at 0 and at N jobs: the 0-job figures are the
// baseline of the same run. It measures once, whatever b.N (make bench runs it with -benchtime 1x).
//
// The test process raises its RLIMIT_NOFILE to fs.nr_open (inherited by the runner: a job holds two
// descriptors there), where it may, and kernel.pid_max when N jobs (an init step and a sleep each)
// would not fit under it.
func BenchmarkSleepingJobs(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("a runner runs jobs in cgroups: needs root")
	}
	n := 10000
	if s := os.Getenv("SBX_BENCH_SLEEPERS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			b.Fatalf("SBX_BENCH_SLEEPERS=%q: want a positive number", s)
		}
	}
	n = raiseLimits(b, n)
	bin := buildSbx(b)
	ns := natstest.Server(b)
	url := ns.ClientURL()
	coord, lines := startProcess(b, stopSleepers, bin, "coordinator", "--nats", url, "--listen", "127.0.0.1:0", "--data", b.TempDir())
	var addr string
	select {
	case line := <-lines:
		_, rest, _ := strings.Cut(line, "API ")
		addr, _, _ = strings.Cut(rest, ",")
	case <-time.After(60 * time.Second):
		b.Fatal("coordinator did not start")
	}
	run, _ := startProcess(b, stopSleepers, bin, "runner", "--nats", url, "--id", "sleepers", "--slots", strconv.Itoa(n),
		"--cgroup-root", testCgroupRoot("sbx-sleepers-bench"))
	c := client.New(addr, "")
	waitRunner(b, c, "sleepers")

	const window = 10 * time.Second
	idle := func() (runnerCPU, coordCPU float64) {
		r0, c0 := procCPU(b, run), procCPU(b, coord)
		t0 := time.Now()
		time.Sleep(window) // the window measured: nothing is awaited
		el := time.Since(t0)
		return (procCPU(b, run) - r0).Seconds() / el.Seconds() * 100, (procCPU(b, coord) - c0).Seconds() / el.Seconds() * 100
	}
	runnerCPU0, coordCPU0 := idle()
	runnerRSS0, coordRSS0 := procStatus(b, run, "VmRSS"), procStatus(b, coord, "VmRSS")
	runnerThreads0, coordThreads0 := procStatus(b, run, "Threads"), procStatus(b, coord, "Threads")
	runnerFDs0 := procFDs(b, run)

	ctx := b.Context()
	b.ResetTimer()
	t0 := time.Now()
	ids := startSleepers(b, c, n)
	// Every job runs once the runner counts them all and the API says so of each.
	if !poll.Within(10*time.Minute, func() bool {
		rs, err := c.Runners(ctx)
		return err == nil && len(rs) == 1 && rs[0].Running == n
	}) {
		b.Fatalf("the runner does not run all %d jobs", n)
	}
	// The runner counts a job from its start, the coordinator from the runner's event that it runs.
	var queued []string
	if !poll.Within(5*time.Minute, func() bool {
		running := make([]bool, len(ids))
		forEach(b, len(ids), func(i int) error {
			j, err := c.Job(ctx, ids[i])
			if err == nil {
				running[i] = j.Status == client.StatusRunning
				if j.Ended() {
					err = fmt.Errorf("job %s ended: %s", ids[i], j.Status)
				}
			}
			return err
		})
		queued = queued[:0]
		for i, ok := range running {
			if !ok {
				queued = append(queued, ids[i])
			}
		}
		ids = slices.Clone(queued)
		return len(ids) == 0
	}) {
		b.Fatalf("%d jobs do not run, e.g. %s", len(queued), queued[0])
	}
	started := time.Since(t0)
	b.StopTimer()
	runnerCPU, coordCPU := idle()
	runnerRSS, coordRSS := procStatus(b, run, "VmRSS"), procStatus(b, coord, "VmRSS")
	runnerThreads, coordThreads := procStatus(b, run, "Threads"), procStatus(b, coord, "Threads")
	runnerFDs := procFDs(b, run)

	b.ReportMetric(float64(n), "jobs")
	b.ReportMetric(started.Seconds(), "start-all-s")
	b.ReportMetric(float64(runnerRSS-runnerRSS0)/float64(n), "runner-KiB/job")
	b.ReportMetric(float64(coordRSS-coordRSS0)/float64(n), "coordinator-KiB/job")
	b.ReportMetric(float64(runnerRSS0), "runner-idle-KiB")
	b.ReportMetric(float64(coordRSS0), "coordinator-idle-KiB")
	b.ReportMetric(float64(runnerFDs-runnerFDs0)/float64(n), "runner-fds/job")
	b.ReportMetric(float64(runnerThreads0), "runner-threads-0")
	b.ReportMetric(float64(runnerThreads), "runner-threads")
	b.ReportMetric(float64(coordThreads0), "coordinator-threads-0")
	b.ReportMetric(float64(coordThreads), "coordinator-threads")
	b.ReportMetric(runnerCPU0, "runner-cpu%-0")
	b.ReportMetric(runnerCPU, "runner-cpu%")
	b.ReportMetric(coordCPU0, "coordinator-cpu%-0")
	b.ReportMetric(coordCPU, "coordinator-cpu%")
}

// startSleepers starts n `sleep 3600` jobs from 16 clients at once and returns their ids.
func startSleepers(b *testing.B, c *client.Client, n int) []string {
	ids := make([]string, n)
	req := client.StartRequest{Command: "sleep 3600", Cwd: "/"}
	forEach(b, n, func(i int) error {
		r, err := c.Start(b.Context(), req)
		if err != nil {
			return err
		}
		ids[i] = r.Job.ID
		return nil
	})
	return ids
}

// forEach calls f for 0 … n-1 from 16 goroutines and fails with the first error.
func forEach(b *testing.B, n int, f func(int) error) {
	const clients = 16
	next := make(chan int)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range next {
				if err := f(it); err != nil {
					mu.Lock()
					first = cmp.Or(first, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
}

// raiseLimits raises this process's descriptor limit, which the runner inherits, and the kernel's
// pid_max when n jobs need more pids than it allows. It returns how many jobs to run: n, or fewer
// when the descriptor limit cannot be raised enough (a container without CAP_SYS_RESOURCE), said in
// the log, so that the figures come out rather than a runner out of descriptors.
func raiseLimits(b *testing.B, n int) int {
	raw, err := os.ReadFile("/proc/sys/fs/nr_open")
	if err != nil {
		b.Fatal(err)
	}
	nrOpen, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		b.Fatal(err)
	}
	// Without CAP_SYS_RESOURCE (a container) the hard limit stays, and the soft one is raised to it,
	// as Go does at start-up anyway.
	raised := unix.Rlimit{Cur: nrOpen, Max: nrOpen}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &raised); err != nil {
		raised = unix.Rlimit{Cur: old.Max, Max: old.Max}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &raised); err != nil {
			b.Fatal(err)
		}
		b.Logf("RLIMIT_NOFILE stays at its hard limit %d: raising it to %d: %v", old.Max, nrOpen, err)
	}
	// Two descriptors a job, and room for the runner's own.
	if fit := (int(raised.Cur) - descriptorRoom) / 2; fit < n {
		b.Logf("RUNNING %d JOBS, NOT %d: the descriptor limit %d holds two per job and %d more", fit, n, raised.Cur, descriptorRoom)
		n = fit
	}
	b.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_NOFILE, &old) })
	raw, err = os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		b.Fatal(err)
	}
	pidMax, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		b.Fatal(err)
	}
	// An init step and a sleep per job, and room for the runner's threads and the rest of the machine.
	if need := 2*n + 8192; pidMax < need {
		if err := os.WriteFile("/proc/sys/kernel/pid_max", []byte(strconv.Itoa(need)), 0); err != nil {
			b.Fatalf("raise kernel.pid_max from %d to %d: %v", pidMax, need, err)
		}
		b.Logf("raised kernel.pid_max from %d to %d (left so)", pidMax, need)
	}
	return n
}

// stopSleepers is how long the coordinator and the runner get to exit at the end: a runner ends
// its thousands of jobs first.
const stopSleepers = 3 * time.Minute

// descriptorRoom is what a runner needs beside its jobs' descriptors: NATS, the fence, /proc and
// cgroup files open at once, warm init steps.
const descriptorRoom = 1024

// procStatus reads a number from /proc/PID/status (VmRSS in KiB, Threads).
func procStatus(b *testing.B, pid int, field string) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range bytes.Lines(raw) {
		if v, ok := bytes.CutPrefix(line, []byte(field+":")); ok {
			f := strings.Fields(string(v))
			if len(f) > 0 {
				if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
					return n
				}
			}
		}
	}
	b.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}

// procFDs counts the process's open descriptors.
func procFDs(b *testing.B, pid int) int {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		b.Fatal(err)
	}
	return len(entries)
}

// procCPU is the CPU time the process has used (utime+stime of /proc/PID/stat), in USER_HZ ticks
// of 10 ms, as Linux reports them on every architecture sbx runs on.
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which ends with the last ')': state is the first, utime
	// and stime the 12th and 13th.
	i := bytes.LastIndexByte(raw, ')')
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond
}
