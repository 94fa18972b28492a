package main

import (
	"fmt"
	"io"
	"os/exec"
	"sort"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/client"
	"github.com/sbx-dev/sbx/internal/natstest"
)

// percentile returns the p-th percentile (0-100) of durations, in milliseconds.
func percentile(d []time.Duration, p float64) float64 {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, k int) bool { return s[i] < s[k] })
	i := int(float64(len(s)-1) * p / 100)
	return float64(s[i]) / float64(time.Millisecond)
}

// medianUS is the median of the samples, in µs.
func medianUS(us []int64) float64 {
	s := append([]int64(nil), us...)
	sort.Slice(s, func(i, k int) bool { return s[i] < s[k] })
	return float64(s[(len(s)-1)/2])
}

// bareShell is the shell the jobs of these benchmarks run in (the runner's default: bash where
// installed, else sh), which their baselines run bare: the goal is a job costing little more than
// a bare run of the same shell.
func bareShell() string {
	if bash, err := exec.LookPath("bash"); err == nil {
		return bash
	}
	return "/bin/sh"
}

// BenchmarkRunToExit measures `true` from POST /v1/jobs (block_until_ms) to the reply with its exit,
// against a bare fork/exec of the jobs' shell running `true` (bareShell) measured in the same run,
// and reports the median of each stage of the jobs' timings (<stage>-us, µs since the coordinator
// accepted the start) to show where the time goes.
func BenchmarkRunToExit(b *testing.B) {
	s := startServe(b)
	ctx := b.Context()
	req := client.StartRequest{Command: "true", Cwd: "/", BlockUntil: 10 * time.Second}
	for range 5 { // warm up
		if _, err := s.c.Start(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	api := make([]time.Duration, 0, b.N)
	byStage := map[string][]int64{}
	var order []string
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		r, err := s.c.Start(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		api = append(api, time.Since(t0))
		if r.Backgrounded || r.Job.ExitCode == nil || *r.Job.ExitCode != 0 {
			b.Fatalf("job did not end within block_until_ms: %+v", r.Job)
		}
		for _, st := range stages(r) {
			if st.us == nil {
				continue // first_output: `true` writes nothing
			}
			if _, ok := byStage[st.name]; !ok {
				order = append(order, st.name)
			}
			byStage[st.name] = append(byStage[st.name], *st.us)
		}
	}
	b.StopTimer()
	shell := bareShell()
	bare := make([]time.Duration, 0, b.N)
	for range b.N {
		t0 := time.Now()
		if err := exec.Command(shell, "-c", "true").Run(); err != nil {
			b.Fatal(err)
		}
		bare = append(bare, time.Since(t0))
	}
	b.ReportMetric(percentile(api, 50), "p50-ms")
	b.ReportMetric(percentile(api, 99), "p99-ms")
	b.ReportMetric(percentile(bare, 50), "bare-p50-ms")
	b.ReportMetric(percentile(bare, 99), "bare-p99-ms")
	b.ReportMetric(percentile(api, 50)/percentile(bare, 50), "p50-x-bare")
	for _, name := range order {
		b.ReportMetric(medianUS(byStage[name]), name+"-us")
	}
}

// BenchmarkOutputThroughput measures one job writing 256 MiB into the coordinator: from the start to
// the job's end with every byte stored, then checks the bytes; against the same command's output
// read bare from a pipe to EOF, in the same run.
func BenchmarkOutputThroughput(b *testing.B) {
	s := startServe(b)
	ctx := b.Context()
	const size = 256 << 20
	line := "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmnopqrstuvwxyz"
	command := fmt.Sprintf("yes %s | head -c %d", line, size)
	req := client.StartRequest{Command: command, Cwd: "/"}
	b.SetBytes(size)
	b.ResetTimer()
	var elapsed time.Duration
	for range b.N {
		t0 := time.Now()
		r, err := s.c.Start(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		w, err := s.c.Wait(ctx, r.Job.ID, time.Minute, "")
		if err != nil || !w.Done {
			b.Fatalf("wait: %+v, %v", w, err)
		}
		elapsed += time.Since(t0)
		b.StopTimer()
		out, total, err := s.c.Output(ctx, r.Job.ID, 0, -1)
		if err != nil || total != size || len(out) != size {
			b.Fatalf("output: %d bytes (total %d), %v", len(out), total, err)
		}
		want := []byte(line + "\n")
		for off := 0; off < size; off += len(want) {
			n := min(len(want), size-off)
			if string(out[off:off+n]) != string(want[:n]) {
				b.Fatalf("output differs at byte %d", off)
			}
		}
		b.StartTimer()
	}
	b.StopTimer()
	var bare time.Duration
	for range b.N {
		cmd := exec.Command(bareShell(), "-c", command)
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		// 64 KiB reads, as the runner's (io.Discard's own ReadFrom reads 8 KiB at a time).
		n, err := io.CopyBuffer(struct{ io.Writer }{io.Discard}, struct{ io.Reader }{out}, make([]byte, 64<<10))
		if err != nil || n != size {
			b.Fatalf("bare pipe: %d bytes, %v", n, err)
		}
		if err := cmd.Wait(); err != nil {
			b.Fatal(err)
		}
		bare += time.Since(t0)
	}
	rate := float64(size*b.N) / elapsed.Seconds() / 1e6
	bareRate := float64(size*b.N) / bare.Seconds() / 1e6
	b.ReportMetric(rate, "MB/s")
	b.ReportMetric(bareRate, "bare-MB/s")
	b.ReportMetric(rate/bareRate, "x-bare")
}

// BenchmarkExitToNotification measures, for `true` started in the background, the time from the
// job's ended_at (the runner's clock, on this machine) to the moment a long-polling client
// (GET /v1/notifications?wait_ms=) has its finished notification.
func BenchmarkExitToNotification(b *testing.B) {
	s := startServe(b)
	ctx := b.Context()
	const session = "bench"
	type arrival struct {
		job string
		at  time.Time
	}
	arrivals := make(chan arrival, 64)
	pollErr := make(chan error, 1)
	go func() {
		var after uint64
		for {
			page, err := s.c.Notifications(ctx, session, &after, time.Minute)
			now := time.Now()
			if err != nil {
				if ctx.Err() == nil {
					pollErr <- err
				}
				close(arrivals)
				return
			}
			for _, n := range page.Notifications {
				if n.Kind == "finished" {
					arrivals <- arrival{n.JobID, now}
				}
			}
			after = page.Next
		}
	}()
	req := client.StartRequest{Command: "true", Cwd: "/", Session: session}
	one := func() time.Duration {
		r, err := s.c.Start(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		var a arrival
		select {
		case a = <-arrivals:
		case err := <-pollErr:
			b.Fatal(err)
		case <-time.After(30 * time.Second):
			b.Fatal("no notification")
		}
		if a.job != r.Job.ID {
			b.Fatalf("notification of %s, want %s", a.job, r.Job.ID)
		}
		j, err := s.c.Job(ctx, r.Job.ID)
		if err != nil || j.EndedAt == nil {
			b.Fatalf("job %+v, %v", j, err)
		}
		return a.at.Sub(*j.EndedAt)
	}
	for range 5 { // warm up
		one()
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		lat = append(lat, one())
	}
	b.StopTimer()
	b.ReportMetric(percentile(lat, 50), "p50-ms")
	b.ReportMetric(percentile(lat, 99), "p99-ms")
}

// BenchmarkJobsPerSecond measures short jobs end to end with 8 clients at once: each starts `true`
// with block_until_ms and waits for its exit in the reply; against 8 goroutines forking the jobs'
// shell running `true` (bareShell) in the same run.
func BenchmarkJobsPerSecond(b *testing.B) {
	s := startServe(b, "--slots", "16")
	jobsPerSecond(b, s.c)
}

// BenchmarkJobsPerSecondFleet is BenchmarkJobsPerSecond on `sbx coordinator`s and a runner over one
// NATS server: with one coordinator, and with two, the clients split between them (the standby
// forwards each call to the leader, docs/decisions.md "Several coordinators").
func BenchmarkJobsPerSecondFleet(b *testing.B) {
	for _, n := range []int{1, 2} {
		b.Run(fmt.Sprintf("coordinators-%d", n), func(b *testing.B) {
			ns := natstest.Server(b)
			var cs []*client.Client
			for range n {
				_, c := startFleetCoordinator(b, ns.ClientURL())
				cs = append(cs, c)
			}
			startFleetRunner(b, ns.ClientURL(), "bench", "--slots", "16")
			for _, c := range cs {
				waitRunner(b, c, "bench")
			}
			jobsPerSecond(b, cs...)
		})
	}
}

// jobsPerSecond runs b.N jobs from 8 clients, spread over cs, and the same number of bare forks,
// and reports both rates and their ratio.
func jobsPerSecond(b *testing.B, cs ...*client.Client) {
	const clients = 8
	ctx := b.Context()
	req := client.StartRequest{Command: "true", Cwd: "/", BlockUntil: 10 * time.Second}
	for _, c := range cs { // warm up
		for range 5 {
			if _, err := c.Start(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	}
	parallel := func(run func(i int) error) float64 {
		next := make(chan struct{}, b.N)
		for range b.N {
			next <- struct{}{}
		}
		close(next)
		errs := make(chan error, clients)
		t0 := time.Now()
		for i := range clients {
			go func() {
				for range next {
					if err := run(i); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for range clients {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		return float64(b.N) / time.Since(t0).Seconds()
	}
	b.ResetTimer()
	api := parallel(func(i int) error {
		r, err := cs[i%len(cs)].Start(ctx, req)
		if err == nil && (r.Backgrounded || r.Job.ExitCode == nil || *r.Job.ExitCode != 0) {
			err = fmt.Errorf("job did not end within block_until_ms: %+v", r.Job)
		}
		return err
	})
	b.StopTimer()
	shell := bareShell()
	bare := parallel(func(int) error { return exec.Command(shell, "-c", "true").Run() })
	b.ReportMetric(api, "jobs/s")
	b.ReportMetric(bare, "bare-jobs/s")
	b.ReportMetric(api/bare, "x-bare")
}
