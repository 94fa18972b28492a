package sandbox

import (
	"testing"
)

// TestSeparateStderr: with SeparateStderr, stdout and stderr arrive on their own pipes, also from a
// lingering child; without it Errors is nil and both share Output.
func TestSeparateStderr(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		spec := sh("apart", `echo out1; echo err1 >&2; (sleep 0.2; echo err2 >&2; echo out2) &`)
		spec.SeparateStderr, spec.Linger = true, true
		p, err := m.Start(spec)
		if err != nil {
			t.Fatal(err)
		}
		if p.Errors() == nil {
			t.Fatal("no error pipe")
		}
		out, errs := drain(t, p.Output()), drain(t, p.Errors())
		if res, err := p.Wait(); err != nil || res.ExitCode != 0 {
			t.Fatalf("Wait = %+v, %v", res, err)
		}
		if got := out(); got != "out1\nout2\n" {
			t.Errorf("stdout %q", got)
		}
		if got := errs(); got != "err1\nerr2\n" {
			t.Errorf("stderr %q", got)
		}

		p, err = m.Start(sh("shared", `echo out; echo err >&2`))
		if err != nil {
			t.Fatal(err)
		}
		if p.Errors() != nil {
			t.Error("a job without SeparateStderr has an error pipe")
		}
		out = drain(t, p.Output())
		if _, err := p.Wait(); err != nil {
			t.Fatal(err)
		}
		if got := out(); got != "out\nerr\n" {
			t.Errorf("shared: %q", got)
		}
	})
}
