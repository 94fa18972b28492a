package sandbox

import (
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkStartWait measures a whole job of /bin/true: cgroup created, process started inside it,
// output read to EOF, waited for, cgroup removed. Compare with BenchmarkBareExec.
func BenchmarkStartWait(b *testing.B) {
	for _, cfg := range testConfigs(b) {
		b.Run(cfg.Version, func(b *testing.B) {
			m, _ := newTestManager(b, cfg)
			cpu := selfCPU(b)
			for i := 0; b.Loop(); i++ {
				p, err := m.Start(Spec{ID: "bench-" + strconv.Itoa(i), Path: "/bin/true"})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, p.Output()); err != nil {
					b.Fatal(err)
				}
				if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
					b.Fatalf("Wait = %+v, %v", res, err)
				}
			}
			b.ReportMetric(float64((selfCPU(b)-cpu).Microseconds())/float64(b.N), "cpu-us/op")
		})
	}
}

// selfCPU is the CPU time this process used so far, user and system: what a job costs the runner
// beyond its own processes.
func selfCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkBareExec is the floor: os/exec running sh -c true, no cgroup.
func BenchmarkBareExec(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("sh", "-c", "true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadonly measures a readonly job of `sh -c true` (cgroup, bwrap, seccomp) against bwrap
// run bare by os/exec with the same arguments and the same filter, in the same run.
func BenchmarkReadonly(b *testing.B) {
	if _, err := exec.LookPath("bwrap"); err != nil {
		b.Skip("bwrap is not installed")
	}
	for _, cfg := range testConfigs(b) {
		b.Run(cfg.Version, func(b *testing.B) {
			m, _ := newTestManager(b, cfg)
			tools, err := m.ro.get(m.bwrap)
			if err != nil {
				b.Skipf("readonly unavailable: %v", err)
			}
			var sbx, bare []time.Duration
			for i := 0; b.Loop(); i++ {
				t0 := time.Now()
				p, err := m.Start(Spec{ID: "ro-bench-" + strconv.Itoa(i), Path: "/bin/sh", Args: []string{"sh", "-c", "true"}, Dir: "/", Readonly: true})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, p.Output()); err != nil {
					b.Fatal(err)
				}
				if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
					b.Fatalf("Wait = %+v, %v", res, err)
				}
				sbx = append(sbx, time.Since(t0))

				t0 = time.Now()
				spec, env, err := tools.wrap(Spec{Path: "/bin/sh", Args: []string{"sh", "-c", "true"}, Dir: "/"}, nil)
				if err != nil {
					b.Fatal(err)
				}
				prog, err := tools.program()
				if err != nil {
					b.Fatal(err)
				}
				args, err := memfdWith("env", env)
				if err != nil {
					b.Fatal(err)
				}
				cmd := exec.Command(spec.Path, spec.Args[1:]...)
				cmd.Env = spec.Env
				cmd.ExtraFiles = []*os.File{nil, prog, nil, args}
				if err := cmd.Run(); err != nil {
					b.Fatalf("bare bwrap: %v", err)
				}
				prog.Close()
				args.Close()
				bare = append(bare, time.Since(t0))
			}
			p50, barep50 := quantile(sbx, 0.5), quantile(bare, 0.5)
			b.ReportMetric(p50, "p50-ms")
			b.ReportMetric(quantile(sbx, 0.99), "p99-ms")
			b.ReportMetric(barep50, "bare-p50-ms")
			b.ReportMetric(quantile(bare, 0.99), "bare-p99-ms")
			b.ReportMetric(p50/barep50, "p50-x-bare")
		})
	}
}

// quantile returns the q-quantile of durations in milliseconds.
func quantile(d []time.Duration, q float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[int(float64(len(s)-1)*q)]) / float64(time.Millisecond)
}
