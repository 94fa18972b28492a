package proto

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func validWork() Work {
	return Work{V: Version, JobID: "j1", Command: "echo hi", Cwd: "/tmp", Pool: "default", Claim: testClaim}
}

// testClaim is a valid claim token.
const testClaim = "c0ffee0123456789"

func TestWorkRoundTrip(t *testing.T) {
	w := validWork()
	w.Env = map[string]string{"A": "b"}
	w.Limits = Limits{MemoryBytes: 64 << 20, Pids: 40}
	w.User = "dev.user-1"
	got, err := DecodeWork(Encode(&w))
	if err != nil {
		t.Fatal(err)
	}
	if got.JobID != w.JobID || got.Env["A"] != "b" || got.Limits.Pids != 40 || got.User != w.User {
		t.Fatalf("round trip changed the message: %+v", got)
	}
	w = validWork()
	w.Command, w.Source = "", &Source{WS: "wss://example.com:8443/events?x=1"}
	if got, err = DecodeWork(Encode(&w)); err != nil || got.Source == nil || got.Source.WS != w.Source.WS {
		t.Fatalf("source work: %+v, %v", got, err)
	}
}

// TestWorkExpired: work expires only once NotAfter has passed, and never without one.
func TestWorkExpired(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	for _, tt := range []struct {
		notAfter int64
		want     bool
	}{{0, false}, {1_000_001, false}, {1_000_000, false}, {999_999, true}} {
		w := validWork()
		w.NotAfter = tt.notAfter
		if got := w.Expired(now); got != tt.want {
			t.Errorf("not_after %d at %d: expired %v, want %v", tt.notAfter, now.UnixMilli(), got, tt.want)
		}
	}
}

func TestDecodeWorkRejects(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Work)
		field  string
	}{
		{"version", func(w *Work) { w.V = 2 }, "version"},
		{"empty command", func(w *Work) { w.Command = "" }, "command"},
		{"huge command", func(w *Work) { w.Command = strings.Repeat("x", MaxCommandBytes+1) }, "command"},
		{"relative cwd", func(w *Work) { w.Cwd = "tmp" }, "cwd"},
		{"bad job id", func(w *Work) { w.JobID = "a.b" }, "job_id"},
		{"bad pool", func(w *Work) { w.Pool = "" }, "pool"},
		{"no claim", func(w *Work) { w.Claim = "" }, "claim"},
		{"short claim", func(w *Work) { w.Claim = "abc" }, "claim"},
		{"claim with a dot", func(w *Work) { w.Claim = "c0ffee0123456789.x" }, "claim"},
		{"negative memory", func(w *Work) { w.Limits.MemoryBytes = -1 }, "limits.memory_bytes"},
		{"absurd pids", func(w *Work) { w.Limits.Pids = MaxPids + 1 }, "limits.pids"},
		{"env key with =", func(w *Work) { w.Env = map[string]string{"A=B": "c"} }, "env key"},
		{"user with slash", func(w *Work) { w.User = "../root" }, "user"},
		{"shell path", func(w *Work) { w.Shell = "/bin/zsh" }, "shell"},
		{"user with colon", func(w *Work) { w.User = "a:b" }, "user"},
		{"user starting with -", func(w *Work) { w.User = "-r" }, "user"},
		{"long user", func(w *Work) { w.User = strings.Repeat("u", MaxUserBytes+1) }, "user"},
		{"negative not_after", func(w *Work) { w.NotAfter = -1 }, "not_after"},
		{"command and source", func(w *Work) { w.Source = &Source{WS: "ws://h/x"} }, "not both"},
		{"http source", func(w *Work) { w.Command, w.Source = "", &Source{WS: "http://h/x"} }, "source.ws"},
		{"source without host", func(w *Work) { w.Command, w.Source = "", &Source{WS: "ws:///x"} }, "source.ws"},
		{"readonly source", func(w *Work) { w.Command, w.Readonly, w.Source = "", true, &Source{WS: "ws://h/x"} }, "readonly"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := validWork()
			tt.mutate(&w)
			_, err := DecodeWork(Encode(&w))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("got %v, want ErrInvalid naming %q", err, tt.field)
			}
		})
	}
	for _, raw := range []string{`{"v":1`, `[]`, `{"v":1,"unknown":1}`, `{"v":1} {}`} {
		if _, err := DecodeWork([]byte(raw)); !errors.Is(err, ErrInvalid) {
			t.Errorf("DecodeWork(%s) = %v, want ErrInvalid", raw, err)
		}
	}
}

func TestEventValidate(t *testing.T) {
	code := 0
	now := time.Now()
	tests := []struct {
		name string
		e    Event
		ok   bool
	}{
		{"accepted", Event{V: 1, Kind: EventAccepted, JobID: "j", Runner: "r", Claim: testClaim, Time: now}, true},
		{"started", Event{V: 1, Kind: EventStarted, JobID: "j", Runner: "r", Claim: testClaim, Time: now, Pid: 7}, true},
		{"started without a process", Event{V: 1, Kind: EventStarted, JobID: "j", Runner: "r", Claim: testClaim, Time: now}, true},
		{"started with a negative pid", Event{V: 1, Kind: EventStarted, JobID: "j", Runner: "r", Claim: testClaim, Time: now, Pid: -1}, false},
		{"exited", Event{V: 1, Kind: EventExited, JobID: "j", Runner: "r", Claim: testClaim, Time: now, ExitCode: &code, Reason: ReasonExit}, true},
		{"exited without code", Event{V: 1, Kind: EventExited, JobID: "j", Runner: "r", Claim: testClaim, Time: now, Reason: ReasonExit}, false},
		{"killed before start", Event{V: 1, Kind: EventExited, JobID: "j", Runner: "r", Claim: testClaim, Time: now, Reason: ReasonKilled}, true},
		{"start failed", Event{V: 1, Kind: EventExited, JobID: "j", Runner: "r", Claim: testClaim, Time: now, Reason: ReasonStartFailed, Error: "no cwd"}, true},
		{"lost by a self-fencing runner", Event{V: 1, Kind: EventExited, JobID: "j", Runner: "r", Claim: testClaim, Time: now, ExitCode: &code, Reason: ReasonLost}, true},
		{"session_ended is not a runner's", Event{V: 1, Kind: EventExited, JobID: "j", Runner: "r", Claim: testClaim, Time: now, Reason: ReasonSessionEnded}, false},
		{"unknown kind", Event{V: 1, Kind: "x", JobID: "j", Runner: "r", Claim: testClaim, Time: now}, false},
		{"no time", Event{V: 1, Kind: EventAccepted, JobID: "j", Runner: "r", Claim: testClaim}, false},
		{"no claim", Event{V: 1, Kind: EventAccepted, JobID: "j", Runner: "r", Time: now}, false},
		{"exited with stages", Event{V: 1, Kind: EventExited, JobID: "j", Runner: "r", Claim: testClaim, Time: now, ExitCode: &code, Reason: ReasonExit,
			Stages: &Stages{CgroupUS: 300, ExecUS: 900, ExitUS: 2000, SentUS: 2100}}, true},
		{"accepted with sent_us alone", Event{V: 1, Kind: EventAccepted, JobID: "j", Runner: "r", Claim: testClaim, Time: now, Stages: &Stages{SentUS: 40}}, true},
		{"negative stage", Event{V: 1, Kind: EventStarted, JobID: "j", Runner: "r", Claim: testClaim, Time: now, Stages: &Stages{ExecUS: -1, SentUS: 5}}, false},
		{"stage after sent", Event{V: 1, Kind: EventStarted, JobID: "j", Runner: "r", Claim: testClaim, Time: now, Stages: &Stages{ExecUS: 9, SentUS: 5}}, false},
		{"stages on activity", Event{V: 1, Kind: EventActivity, JobID: "j", Runner: "r", Claim: testClaim, Time: now, Seq: 1, Stages: &Stages{SentUS: 5}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeEvent(Encode(&tt.e))
			if (err == nil) != tt.ok {
				t.Fatalf("DecodeEvent = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestChunkRoundTrip(t *testing.T) {
	c := Chunk{JobID: "j1", Claim: testClaim, Offset: 1 << 33, Data: []byte("hello")}
	h := c.Headers()
	if h[HeaderMsgID][0] != "j1:"+testClaim+":o:8589934592" {
		t.Fatalf("msg id %q", h[HeaderMsgID][0])
	}
	got, err := DecodeChunk(OutputSubject("r1", "j1"), h, c.Data)
	if err != nil || got.Offset != c.Offset || !bytes.Equal(got.Data, c.Data) || got.Runner != "r1" || got.Claim != testClaim {
		t.Fatalf("DecodeChunk = %+v, %v", got, err)
	}
	noClaim := c.Headers()
	delete(noClaim, HeaderClaim)
	if _, err := DecodeChunk(OutputSubject("r1", "j1"), noClaim, c.Data); err == nil {
		t.Fatal("a chunk without a claim accepted")
	}
	h[HeaderOffset] = []string{"-1"}
	if _, err := DecodeChunk(OutputSubject("r1", "j1"), h, c.Data); err == nil {
		t.Fatal("negative offset accepted")
	}
	if _, err := DecodeChunk(OutputSubject("r1", "j1"), c.Headers(), make([]byte, MaxChunkBytes+1)); err == nil {
		t.Fatal("oversized chunk accepted")
	}
	if _, err := DecodeChunk(StateSubject("r1", "j1"), c.Headers(), c.Data); err == nil {
		t.Fatal("a chunk on a state subject accepted")
	}
	if got.Stderr {
		t.Fatal("a stdout chunk decoded as stderr")
	}
	e := Chunk{JobID: "j1", Claim: testClaim, Offset: 3, Data: []byte("oops"), Stderr: true}
	if got, err := DecodeChunk(OutputSubject("r1", "j1"), e.Headers(), e.Data); err != nil || !got.Stderr {
		t.Fatalf("stderr chunk = %+v, %v", got, err)
	}
	h = e.Headers()
	h[HeaderStream] = []string{"stdin"}
	if _, err := DecodeChunk(OutputSubject("r1", "j1"), h, e.Data); err == nil {
		t.Fatal("an unknown stream accepted")
	}
}

func TestControlValidate(t *testing.T) {
	for _, c := range []Control{{V: 1, Op: OpKill, JobID: "j"}, {V: 1, Op: OpSignal, JobID: "j", Signal: "INT"}, {V: 1, Op: OpPing},
		{V: 1, Op: OpStdin, JobID: "j", Data: []byte("y\n\x00\xff")}, {V: 1, Op: OpStdin, JobID: "j", Close: true},
		{V: 1, Op: OpConfirm, JobID: "j"}} {
		got, err := DecodeControl(Encode(&c))
		if err != nil {
			t.Errorf("%+v: %v", c, err)
		} else if string(got.Data) != string(c.Data) || got.Close != c.Close {
			t.Errorf("%+v came back as %+v", c, got)
		}
	}
	for _, c := range []Control{{V: 1, Op: OpKill}, {V: 1, Op: OpSignal, JobID: "j", Signal: "SEGV"}, {V: 1, Op: "reboot", JobID: "j"},
		{V: 1, Op: OpStdin, JobID: "j", Data: make([]byte, MaxStdinBytes+1)}, {V: 1, Op: OpStdin, Data: []byte("x")}, {V: 1, Op: OpConfirm}} {
		if _, err := DecodeControl(Encode(&c)); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func TestParseEventSubject(t *testing.T) {
	runner, job, kind, ok := ParseEventSubject(OutputSubject("r-1", "abc"))
	if !ok || runner != "r-1" || job != "abc" || kind != KindOutput {
		t.Fatalf("got %q %q %q %v", runner, job, kind, ok)
	}
	if runner, job, kind, ok = ParseEventSubject(StateSubject("r", "j")); !ok || runner != "r" || job != "j" || kind != KindState {
		t.Fatalf("state subject: got %q %q %q %v", runner, job, kind, ok)
	}
	for _, s := range []string{"sbx.v1.events.abc", "sbx.v1.events.abc.out", "sbx.v1.events.r.a.b.out", "sbx.v1.work.x.plain",
		"sbx.v1.events..j.out", "sbx.v1.events.r..out", "sbx.v1.events.r.j.exit"} {
		if _, _, _, ok := ParseEventSubject(s); ok {
			t.Errorf("%q accepted", s)
		}
	}
	if id, pool, ok := ParseHeartbeatSubject(HeartbeatSubject("r-1", "p_1")); !ok || id != "r-1" || pool != "p_1" {
		t.Errorf("heartbeat subject: %q %q %v", id, pool, ok)
	}
	for _, s := range []string{"sbx.v1.heartbeat.a", "sbx.v1.heartbeat.a.b.c", "sbx.v1.heartbeat..b"} {
		if _, _, ok := ParseHeartbeatSubject(s); ok {
			t.Errorf("heartbeat subject %q accepted", s)
		}
	}
	if id, ok := RunnerFromConfirm(ConfirmSubject("r-1")); !ok || id != "r-1" {
		t.Errorf("confirm subject: %q %v", id, ok)
	}
	if _, ok := RunnerFromConfirm("sbx.v1.confirm.a.b"); ok {
		t.Error("a confirm subject of two tokens accepted")
	}
	for _, tc := range []struct{ pool, capability string }{{"default", CapPlain}, {"a_readonly", CapReadonly}, {"x_plain", CapPlain}} {
		if pool, c, ok := ParseWorkConsumer(WorkConsumer(tc.pool, tc.capability)); !ok || pool != tc.pool || c != tc.capability {
			t.Errorf("work consumer of %v: %q %q %v", tc, pool, c, ok)
		}
	}
	if key, ok := WorkKeyOf(WorkIngestSubjects("k3y")); !ok || key != "k3y" {
		t.Errorf("work ingest subjects: %q %v", key, ok)
	}
	for _, s := range []string{"sbx.v1.queue.>", "sbx.v1.queue.a.b.>", "sbx.v1.work.>", "sbx.v1.queue.k"} {
		if _, ok := WorkKeyOf(s); ok {
			t.Errorf("work ingest subjects %q accepted", s)
		}
	}
	if key, ok := OutputKeyOf(OutputIngestSubjects("k3y")); !ok || key != "k3y" {
		t.Errorf("output ingest subjects: %q %v", key, ok)
	}
	for _, s := range []string{"sbx.v1.keep.>", "sbx.v1.keep.a.b.>", OutputSubjects, "sbx.v1.keep.k"} {
		if _, ok := OutputKeyOf(s); ok {
			t.Errorf("output ingest subjects %q accepted", s)
		}
	}
	for _, s := range []string{"work_a", "work__plain", "work_a_other", "coordinator", "work_a.b_plain"} {
		if _, _, ok := ParseWorkConsumer(s); ok {
			t.Errorf("work consumer %q accepted", s)
		}
	}
}

func FuzzDecodeWork(f *testing.F) {
	w := validWork()
	f.Add(Encode(&w))
	f.Add([]byte(`{"v":1,"job_id":"x","command":"a","cwd":"/","pool":"p","limits":{"pids":-1}}`))
	w.TTY, w.TTYSize = true, &TTYSize{Rows: 24, Cols: 80}
	f.Add(Encode(&w))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := DecodeWork(data)
		if err != nil {
			return
		}
		// Whatever decodes must validate again after a round trip.
		if _, err := DecodeWork(Encode(got)); err != nil {
			t.Fatalf("re-decoding a valid work message: %v", err)
		}
	})
}

func FuzzDecodeEvent(f *testing.F) {
	code := 1
	f.Add(Encode(&Event{V: 1, Kind: EventExited, JobID: "j", Runner: "r", Claim: testClaim, Time: time.Now(), ExitCode: &code, Reason: ReasonExit}))
	since := time.Now()
	f.Add(Encode(&Event{V: 1, Kind: EventActivity, JobID: "j", Runner: "r", Claim: testClaim, Time: time.Now(), Seq: 1, InputSince: &since, Ports: []Port{{"::1", 80}}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := DecodeEvent(data)
		if err != nil {
			return
		}
		if _, err := DecodeEvent(Encode(got)); err != nil {
			t.Fatalf("re-decoding a valid event: %v", err)
		}
	})
}

func FuzzDecodeChunk(f *testing.F) {
	f.Add(OutputSubject("r1", "j1"), "0", testClaim, []byte("x"))
	f.Fuzz(func(t *testing.T, subject, off, claim string, data []byte) {
		c, err := DecodeChunk(subject, map[string][]string{HeaderOffset: {off}, HeaderClaim: {claim}}, data)
		if err != nil {
			return
		}
		if c.Offset < 0 || !ValidToken(c.JobID) || !ValidToken(c.Runner) || !ValidClaim(c.Claim) || len(c.Data) == 0 || len(c.Data) > MaxChunkBytes {
			t.Fatalf("invalid chunk accepted: %+v", c)
		}
	})
}

func FuzzDecodeControl(f *testing.F) {
	f.Add(Encode(&Control{V: 1, Op: OpKill, JobID: "j"}))
	f.Add(Encode(&Control{V: 1, Op: OpResize, JobID: "j", Size: &TTYSize{Rows: 24, Cols: 80}}))
	f.Fuzz(func(t *testing.T, data []byte) {
		if c, err := DecodeControl(data); err == nil {
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func FuzzDecodeHeartbeat(f *testing.F) {
	f.Add(Encode(&Heartbeat{V: 1, Runner: "r", Pool: "p", Slots: 2, Time: time.Now(), Boot: time.Now()}))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := DecodeHeartbeat(data)
		if err != nil {
			return
		}
		if h.Running > h.Slots || !ValidToken(h.Runner) {
			t.Fatalf("inconsistent heartbeat accepted: %+v", h)
		}
	})
}

// TestHeartbeatJobs: a heartbeat lists the runner's jobs by id, within bounds.
func TestHeartbeatJobs(t *testing.T) {
	ok := Heartbeat{V: 1, Runner: "r", Pool: "p", Slots: 2, Time: time.Now(), Boot: time.Now(), Jobs: []string{"j1", "j2"}}
	if h, err := DecodeHeartbeat(Encode(&ok)); err != nil || len(h.Jobs) != 2 || h.Jobs[1] != "j2" {
		t.Fatalf("heartbeat with jobs: %+v, %v", h, err)
	}
	bad := ok
	bad.Jobs = []string{"j1", "a.b"}
	if _, err := DecodeHeartbeat(Encode(&bad)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "jobs") {
		t.Errorf("a job id that is not a token: %v", err)
	}
	bad.Jobs = make([]string, MaxHeartbeatJobs+1)
	for i := range bad.Jobs {
		bad.Jobs[i] = "j"
	}
	if _, err := DecodeHeartbeat(Encode(&bad)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "jobs") {
		t.Errorf("too many jobs: %v", err)
	}
}

// TestRunnerTimes: the heartbeat interval and the fence derive from the runner deadline, the fence
// firing a heartbeat interval before the deadline.
func TestRunnerTimes(t *testing.T) {
	for _, c := range []struct{ deadline, beat, fence time.Duration }{
		{DefaultRunnerDeadline, 2 * time.Second, 6 * time.Second},
		{2 * time.Second, 500 * time.Millisecond, 1500 * time.Millisecond},
		{time.Hour, 2 * time.Second, time.Hour - 2*time.Second},
		{MinRunnerDeadline, 25 * time.Millisecond, 75 * time.Millisecond},
	} {
		if b, f := HeartbeatInterval(c.deadline), RunnerFenceAfter(c.deadline); b != c.beat || f != c.fence {
			t.Errorf("deadline %s: heartbeat %s, fence %s; want %s, %s", c.deadline, b, f, c.beat, c.fence)
		}
	}
}
