package sandbox

import (
	"io"
	"os/exec"
	"strconv"
	"testing"
)

// BenchmarkStartWait measures a whole job of /bin/true: cgroup created, process started inside it,
// output read to EOF, waited for, cgroup removed. Compare with BenchmarkBareExec.
func BenchmarkStartWait(b *testing.B) {
	for _, cfg := range testConfigs(b) {
		b.Run(cfg.Version, func(b *testing.B) {
			m, _ := newTestManager(b, cfg)
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
		})
	}
}

// BenchmarkBareExec is the floor: os/exec running sh -c true, no cgroup.
func BenchmarkBareExec(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("sh", "-c", "true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}
