package sandbox

import (
	"testing"
)

// TestStdin: a job started with Stdin reads what is written to Input and sees EOF when it is closed;
// one without reads /dev/null.
func TestStdin(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		spec := sh("stdin", `read line; echo "got $line"; cat; echo eof`)
		spec.Stdin = true
		p, err := m.Start(spec)
		if err != nil {
			t.Fatal(err)
		}
		out := drain(t, p.Output())
		in := p.Input()
		if in == nil {
			t.Fatal("no input pipe")
		}
		if _, err := in.Write([]byte("hello\nrest ")); err != nil {
			t.Fatal(err)
		}
		if _, err := in.Write([]byte("of it\n")); err != nil {
			t.Fatal(err)
		}
		in.Close()
		res, err := p.Wait()
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("Wait = %+v, %v", res, err)
		}
		if got := out(); got != "got hello\nrest of it\neof\n" {
			t.Errorf("output %q", got)
		}

		p, err = m.Start(sh("no-stdin", `cat; echo eof`))
		if err != nil {
			t.Fatal(err)
		}
		if p.Input() != nil {
			t.Error("a job without Stdin has an input pipe")
		}
		out = drain(t, p.Output())
		if _, err := p.Wait(); err != nil {
			t.Fatal(err)
		}
		if got := out(); got != "eof\n" {
			t.Errorf("without stdin: %q", got)
		}
	})
}
