package proto

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestWorkTTY(t *testing.T) {
	base := func() Work {
		return Work{V: 1, JobID: "j1", Command: "bash", Cwd: "/", Pool: "default", Claim: testClaim, TTY: true}
	}
	tests := []struct {
		name  string
		edit  func(*Work)
		field string // "" when valid
	}{
		{"default size", func(*Work) {}, ""},
		{"a size", func(w *Work) { w.TTYSize = &TTYSize{Rows: 40, Cols: 120} }, ""},
		{"zero rows", func(w *Work) { w.TTYSize = &TTYSize{Rows: 0, Cols: 80} }, "tty_size.rows"},
		{"too many cols", func(w *Work) { w.TTYSize = &TTYSize{Rows: 24, Cols: MaxTTYCols + 1} }, "tty_size.cols"},
		{"size without tty", func(w *Work) { w.TTY, w.TTYSize = false, &TTYSize{Rows: 24, Cols: 80} }, "tty_size without tty"},
		{"with separate stderr", func(w *Work) { w.SeparateStderr = true }, "separate_stderr"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := base()
			tt.edit(&w)
			got, err := DecodeWork(Encode(&w))
			if tt.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !got.TTY || (w.TTYSize != nil && *got.TTYSize != *w.TTYSize) {
					t.Fatalf("came back as %+v", got)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("DecodeWork = %v, want ErrInvalid naming %s", err, tt.field)
			}
		})
	}
}

func TestControlResize(t *testing.T) {
	c := Control{V: 1, Op: OpResize, JobID: "j", Size: &TTYSize{Rows: 50, Cols: 132}}
	got, err := DecodeControl(Encode(&c))
	if err != nil || *got.Size != *c.Size {
		t.Fatalf("DecodeControl = %+v, %v", got, err)
	}
	for _, bad := range []Control{{V: 1, Op: OpResize, JobID: "j"}, {V: 1, Op: OpResize, JobID: "j", Size: &TTYSize{Rows: 5, Cols: -1}}} {
		if _, err := DecodeControl(Encode(&bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v, want ErrInvalid", bad, err)
		}
	}
}

func TestEventActivity(t *testing.T) {
	now := time.Now()
	since := now.Add(-3 * time.Second)
	ok := Event{V: 1, Kind: EventActivity, JobID: "j", Runner: "r", Claim: testClaim, Time: now, Seq: 2,
		InputSince: &since, Ports: []Port{{"127.0.0.1", 5173}, {"::", 8080}}}
	got, err := DecodeEvent(Encode(&ok))
	if err != nil {
		t.Fatal(err)
	}
	if got.InputFor() != 3*time.Second || len(got.Ports) != 2 || got.Ports[1] != (Port{"::", 8080}) {
		t.Fatalf("came back as %+v", got)
	}
	other := ok
	other.Seq = 3
	if ok.MsgID() == other.MsgID() {
		t.Fatal("two activity events of a job share a de-duplication id")
	}
	for name, edit := range map[string]func(*Event){
		"no seq":        func(e *Event) { e.Seq = 0 },
		"port 0":        func(e *Event) { e.Ports = []Port{{"127.0.0.1", 0}} },
		"not an IP":     func(e *Event) { e.Ports = []Port{{"localhost", 80}} },
		"too many":      func(e *Event) { e.Ports = make([]Port, MaxPorts+1) },
		"zero since":    func(e *Event) { e.InputSince = &time.Time{} },
		"port too high": func(e *Event) { e.Ports = []Port{{"127.0.0.1", 65536}} },
	} {
		e := ok
		edit(&e)
		if _, err := DecodeEvent(Encode(&e)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}
