package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/httpapi"
)

func TestStartShape(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	r := h.post("/v1/jobs", map[string]any{"command": "make test", "cwd": h.cwd, "limits": map[string]any{"pids": 100}},
		"Sbx-Session", "s1")
	if r.status != http.StatusCreated {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var raw struct {
		Job          map[string]json.RawMessage `json:"job"`
		Output       *string                    `json:"output"`
		Backgrounded *bool                      `json:"backgrounded"`
	}
	r.decode(t, &raw)
	if raw.Output == nil || *raw.Output != "" || raw.Backgrounded == nil || !*raw.Backgrounded {
		t.Errorf("reply %s", r.body)
	}
	want := map[string]string{
		"session": `"s1"`, "title": `"make test"`, "command": `"make test"`, "status": `"queued"`,
		"pool": `"default"`, "readonly": "false", "exit_code": "null", "pid": "null",
		"started_at": "null", "ended_at": "null", "usage": "null", "elapsed_ms": "0", "output_bytes": "0",
		"reason": `""`, "runner": `""`,
	}
	for k, v := range want {
		if got := string(raw.Job[k]); got != v {
			t.Errorf("job.%s = %s, want %s", k, got, v)
		}
	}
	for _, k := range []string{"id", "cwd", "created_at", "output_path", "limits"} {
		if _, ok := raw.Job[k]; !ok {
			t.Errorf("job lacks %s", k)
		}
	}
	for _, k := range []string{"work_seq", "accepted_at", "error"} {
		if _, ok := raw.Job[k]; ok {
			t.Errorf("job shows %s", k)
		}
	}
	var limits map[string]int64
	if err := json.Unmarshal(raw.Job["limits"], &limits); err != nil {
		t.Fatal(err)
	}
	if len(limits) != 5 || limits["pids"] != 100 || limits["memory_bytes"] != 0 {
		t.Errorf("limits %v", limits)
	}
	if w := h.disp.Works(); len(w) != 1 || w[0].Limits.Pids != 100 {
		t.Errorf("dispatched %+v", w)
	}

	// The body's session wins over the header's.
	if s := h.start(map[string]any{"command": "x", "session": "s2"}, "Sbx-Session", "s1"); s.Job.Session != "s2" {
		t.Errorf("session %q", s.Job.Session)
	}
	if s := h.start(map[string]any{"command": "x"}); s.Job.Session != "default" {
		t.Errorf("session %q", s.Job.Session)
	}
}

func TestStartBlock(t *testing.T) {
	t.Run("ends in time", func(t *testing.T) {
		h := newHarness(t, httpapi.Config{})
		h.finishWith("all good\n", 0)
		s := h.start(map[string]any{"command": "true", "block_until_ms": 5000})
		if s.Backgrounded || s.Output != "all good\n" || s.Job.Status != "succeeded" {
			t.Errorf("reply %+v", s)
		}
		if s.Job.ExitCode == nil || *s.Job.ExitCode != 0 || s.Job.Pid == nil || *s.Job.Pid != 4242 {
			t.Errorf("exit_code %v pid %v", s.Job.ExitCode, s.Job.Pid)
		}
		if s.Job.OutputBytes != 9 || string(s.Job.Usage) == "null" {
			t.Errorf("output_bytes %d usage %s", s.Job.OutputBytes, s.Job.Usage)
		}
	})
	t.Run("above the maximum", func(t *testing.T) {
		// Clamped as the agent tools do (to 10 minutes), not refused; the job ends at once here.
		h := newHarness(t, httpapi.Config{})
		h.finishWith("ok\n", 0)
		s := h.start(map[string]any{"command": "true", "block_until_ms": int64(9223372036854775807)})
		if s.Backgrounded || s.Output != "ok\n" {
			t.Errorf("reply %+v", s)
		}
	})
	t.Run("backgrounded", func(t *testing.T) {
		h := newHarness(t, httpapi.Config{})
		h.disp.SetRun(func(w *coordinator.Work) {
			h.begin(w.JobID)
			h.output(w.JobID, 0, "so far")
		})
		s := h.start(map[string]any{"command": "sleep 100", "block_until_ms": 50})
		if !s.Backgrounded || s.Output != "so far" || s.Job.Status != "running" {
			t.Errorf("reply %+v", s)
		}
	})
	t.Run("long output", func(t *testing.T) {
		// 1000 lines of 45 bytes: 45000 bytes, more than the 30 KiB a reply carries.
		var out strings.Builder
		for i := range 1000 {
			fmt.Fprintf(&out, "line %04d %s\n", i, strings.Repeat("x", 34))
		}
		h := newHarness(t, httpapi.Config{})
		h.finishWith(out.String(), 0)
		r := h.post("/v1/jobs", map[string]any{"command": "seq", "cwd": h.cwd, "block_until_ms": 5000})
		var s struct {
			Output           string `json:"output"`
			OutputTruncated  bool   `json:"output_truncated"`
			OutputBytes      int64  `json:"output_bytes"`
			OutputLines      int    `json:"output_lines"`
			OutputTotalLines int    `json:"output_total_lines"`
		}
		r.decode(t, &s)
		// The last 30 KiB start inside line 317 (at byte 14280); the reply starts at the next line.
		if !s.OutputTruncated || s.OutputBytes != 45000 || s.OutputLines != 682 || s.OutputTotalLines != 1000 ||
			!strings.HasPrefix(s.Output, "line 0318 ") || !strings.HasSuffix(out.String(), s.Output) {
			t.Errorf("reply: truncated %v, %d bytes, %d of %d lines, output starts %q", s.OutputTruncated, s.OutputBytes, s.OutputLines, s.OutputTotalLines, s.Output[:min(20, len(s.Output))])
		}
		h.finishWith("short\n", 0)
		r = h.post("/v1/jobs", map[string]any{"command": "echo", "cwd": h.cwd, "block_until_ms": 5000})
		r.decode(t, &s)
		if s.OutputTruncated || s.Output != "short\n" || s.OutputBytes != 6 || s.OutputLines != 1 || s.OutputTotalLines != 1 {
			t.Errorf("short reply: %+v", s)
		}
	})
	t.Run("non-UTF-8 output", func(t *testing.T) {
		h := newHarness(t, httpapi.Config{})
		h.finishWith("a\xffb", 0)
		s := h.start(map[string]any{"command": "printf", "block_until_ms": 5000})
		if s.Output != "a\uFFFDb" {
			t.Errorf("output %q", s.Output)
		}
		if r := h.get("/v1/jobs/" + s.Job.ID + "/output"); string(r.body) != "a\xffb" {
			t.Errorf("/output %q", r.body)
		}
	})
}

func TestStartInvalid(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	cwd := fmt.Sprintf("%q", h.cwd)
	tests := []struct {
		name   string
		body   string
		status int
		code   string
		want   string
	}{
		{"missing command", `{"cwd":` + cwd + `}`, 400, "invalid", "command"},
		{"blank command", `{"command":"  \n","cwd":` + cwd + `}`, 400, "invalid", "command"},
		{"missing cwd", `{"command":"ls"}`, 400, "invalid", "cwd"},
		{"relative cwd", `{"command":"ls","cwd":"src"}`, 400, "invalid", "cwd"},
		{"empty body", ``, 400, "invalid", "body"},
		{"malformed JSON", `{"command": ls}`, 400, "invalid", "body: invalid JSON at byte 13: invalid character 'l'"},
		{"truncated JSON", `{"command": "ls"`, 400, "invalid", "body"},
		{"not an object", `["ls"]`, 400, "invalid", "body must be a JSON object"},
		{"trailing data", `{"command":"ls","cwd":"/"} {}`, 400, "invalid", "body: trailing data"},
		{"unknown field", `{"command":"ls","cwd":"/","foo":1}`, 400, "invalid", `body: unknown field "foo"`},
		{"wrong type", `{"command":"ls","cwd":"/","limits":{"pids":"many"}}`, 400, "invalid", "limits.pids must be a number"},
		{"fraction", `{"command":"ls","cwd":"/","limits":{"pids":1.5}}`, 400, "invalid", "limits.pids must be an integer"},
		{"command not a string", `{"command":["ls"],"cwd":"/"}`, 400, "invalid", "command must be a string"},
		{"env not an object", `{"command":"ls","cwd":"/","env":"A=1"}`, 400, "invalid", "env must be an object"},
		{"negative block", `{"command":"ls","cwd":"/","block_until_ms":-1}`, 400, "invalid", "block_until_ms"},
		{"negative memory", `{"command":"ls","cwd":"/","limits":{"memory_bytes":-1}}`, 400, "invalid", "limits.memory_bytes"},
		{"absurd pids", `{"command":"ls","cwd":"/","limits":{"pids":1099511627776}}`, 400, "invalid", "limits.pids"},
		{"tiny memory", `{"command":"ls","cwd":"/","limits":{"memory_bytes":1}}`, 400, "invalid", "limits.memory_bytes"},
		{"absurd timeout", `{"command":"ls","cwd":"/","limits":{"timeout_ms":1e15}}`, 400, "invalid", "limits.timeout_ms"},
		{"oversized command", `{"command":"` + strings.Repeat("x", 64<<10+1) + `","cwd":"/"}`, 400, "invalid", "command is 65537 bytes"},
		{"oversized env", `{"command":"ls","cwd":"/","env":{"A":"` + strings.Repeat("x", 300<<10) + `"}}`, 400, "invalid", "env"},
		{"bad env key", `{"command":"ls","cwd":"/","env":{"A=B":"1"}}`, 400, "invalid", "env"},
		{"bad session", `{"command":"ls","cwd":"/","session":"a b"}`, 400, "invalid", "session"},
		{"bad pool", `{"command":"ls","cwd":"/","pool":"../x"}`, 400, "invalid", "pool"},
		{"bad user", `{"command":"ls","cwd":"/","user":"root:0"}`, 400, "invalid", "user"},
		{"bad shell", `{"command":"ls","cwd":"/","shell":"/bin/zsh"}`, 400, "invalid", "shell"},
		{"too large body", `{"command":"ls","cwd":"/","title":"` + strings.Repeat("x", 1<<20) + `"}`, 413, "too_large", "body"},
		{"readonly without runner", `{"command":"ls","cwd":"/","readonly":true}`, 503, "readonly_unavailable", "readonly"},
		// What encoding/json accepts silently: the command would run rewritten (U+FFFD), or
		// another than the one a reader of the first field sees.
		{"invalid UTF-8 command", "{\"command\":\"echo \xff\",\"cwd\":\"/\"}", 400, "invalid", "command is not valid UTF-8"},
		{"lone surrogate command", `{"command":"echo \ud800","cwd":"/"}`, 400, "invalid", "command is not valid UTF-8"},
		{"lone low surrogate", `{"command":"echo \udc00\ud800","cwd":"/"}`, 400, "invalid", "command is not valid UTF-8"},
		{"invalid UTF-8 env value", "{\"command\":\"ls\",\"cwd\":\"/\",\"env\":{\"A\":\"\xc3\"}}", 400, "invalid", "env.A is not valid UTF-8"},
		{"invalid UTF-8 field name", "{\"command\":\"ls\",\"cwd\":\"/\",\"env\":{\"\xc3\":\"1\"}}", 400, "invalid", "a field name is not valid UTF-8"},
		{"duplicate command", `{"command":"true","cwd":"/","command":"rm -rf ~"}`, 400, "invalid", "command is given twice"},
		{"duplicate nested", `{"command":"ls","cwd":"/","limits":{"pids":1,"pids":2}}`, 400, "invalid", "limits.pids is given twice"},
		{"duplicate env", `{"command":"ls","cwd":"/","env":{"A":"1","A":"2"}}`, 400, "invalid", "env.A is given twice"},
		{"NUL in title", `{"command":"ls","cwd":"/","title":"a\u0000b"}`, 400, "invalid", "title must be valid UTF-8 without a NUL byte"},
		{"bad session header", `{"command":"ls","cwd":"/"}`, 0, "", ""}, // below, with its header
	}
	for _, tt := range tests {
		if tt.status == 0 {
			continue
		}
		t.Run(tt.name, func(t *testing.T) {
			h.post("/v1/jobs", tt.body).wantError(t, tt.status, tt.code, tt.want)
		})
	}
	t.Run("bad session header", func(t *testing.T) {
		h.post("/v1/jobs", `{"command":"ls","cwd":"/"}`, "Sbx-Session", "../x").wantError(t, 400, "invalid", `Sbx-Session header "../x"`)
	})
	if w := h.disp.Works(); len(w) != 0 {
		t.Errorf("invalid requests dispatched %d jobs", len(w))
	}
	// The strict checks leave what is valid alone: non-ASCII text, surrogate pairs, escapes.
	h.heartbeat()
	r := h.post("/v1/jobs", `{"command":"echo héllo \ud83d\ude00 😀 \\ud800","cwd":`+cwd+`,"title":"naïve"}`)
	var got startReply
	if r.decode(t, &got); r.status != http.StatusCreated || got.Job.Title != "naïve" {
		t.Errorf("valid text refused: status %d: %s", r.status, r.body)
	}
	if w := h.disp.Works(); len(w) != 1 || w[0].Command != `echo héllo 😀 😀 \ud800` {
		t.Errorf("dispatched %+v", w)
	}
}

// TestSessionChecked: a session is checked the same way wherever it is taken: the body, the
// header, the query, the path. GET /v1/jobs?session=../x once answered 200.
func TestSessionChecked(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	for _, tt := range []struct {
		name         string
		method, path string
		body         any
		header       []string
		want         string
	}{
		{"jobs query", "GET", "/v1/jobs?session=../x", nil, nil, `session "../x"`},
		{"jobs header", "GET", "/v1/jobs", nil, []string{"Sbx-Session", "a b"}, `Sbx-Session header "a b"`},
		{"notifications query", "GET", "/v1/notifications?session=../x", nil, nil, `session "../x"`},
		{"notifications header", "GET", "/v1/notifications", nil, []string{"Sbx-Session", "../x"}, `Sbx-Session header "../x"`},
		{"stream query", "GET", "/v1/notifications/stream?session=a%00b", nil, nil, `session "a\x00b"`},
		{"ack body", "POST", "/v1/notifications/ack", map[string]any{"session": "../x", "seq": 0}, nil, `session "../x"`},
		{"open session body", "POST", "/v1/sessions", map[string]any{"id": "../x"}, nil, `id "../x"`},
		{"end session path", "DELETE", "/v1/sessions/..%2Fx", nil, nil, `session id "../x"`},
		{"wait header", "GET", "/v1/jobs/x/wait", nil, []string{"Sbx-Session", "../x"}, `Sbx-Session header "../x"`},
		{"kill body", "POST", "/v1/jobs/x/kill", map[string]any{"session": "../x"}, nil, `session "../x"`},
		{"kill header", "POST", "/v1/jobs/x/kill", map[string]any{}, []string{"Sbx-Session", "../x"}, `Sbx-Session header "../x"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var r *reply
			if tt.body != nil {
				r = h.post(tt.path, tt.body, tt.header...)
			} else {
				r = h.do(tt.method, tt.path, nil, tt.header...)
			}
			r.wantError(t, 400, "invalid", tt.want)
		})
	}
}

func TestNotFound(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	for _, tt := range []struct{ method, path string }{
		{"GET", "/v1/jobs/0000000000000"},
		{"GET", "/v1/jobs/0000000000000/wait?timeout_ms=0"},
		{"GET", "/v1/jobs/0000000000000/output"},
		{"GET", "/v1/jobs/0000000000000/output?follow=true"},
		{"POST", "/v1/jobs/0000000000000/kill"},
	} {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			h.do(tt.method, tt.path, nil).wantError(t, 404, "not_found", "does not exist")
		})
	}
}

func TestJobs(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	a := h.start(map[string]any{"command": "a", "session": "s1"}).Job.ID
	time.Sleep(2 * time.Millisecond) // ids sort by millisecond
	b := h.start(map[string]any{"command": "b", "session": "s2"}).Job.ID
	time.Sleep(2 * time.Millisecond) // likewise
	c := h.start(map[string]any{"command": "c", "session": "s1"}).Job.ID

	var got job
	h.get("/v1/jobs/"+b).decode(t, &got)
	if got.ID != b || got.Title != "b" {
		t.Errorf("job %+v", got)
	}

	ids := func(path string) string {
		t.Helper()
		r := h.get(path)
		if r.status != 200 {
			t.Fatalf("%s: %d %s", path, r.status, r.body)
		}
		var l struct{ Jobs []job }
		r.decode(t, &l)
		var out []string
		for _, j := range l.Jobs {
			out = append(out, j.ID)
		}
		return strings.Join(out, ",")
	}
	for _, tt := range []struct{ query, want string }{
		{"", c + "," + b + "," + a},
		{"?session=s1", c + "," + a},
		{"?limit=1", c},
		{"?status=queued&session=s2", b},
		{"?status=succeeded", ""},
	} {
		if got := ids("/v1/jobs" + tt.query); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.query, got, tt.want)
		}
	}
	for _, tt := range []struct{ query, want string }{
		{"?limit=x", "limit"},
		{"?limit=0", "limit"},
		{"?limit=1001", "limit"},
		{"?status=done", "status"},
	} {
		h.get("/v1/jobs"+tt.query).wantError(t, 400, "invalid", tt.want)
	}
}

func TestKill(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.disp.SetControl(func(_ context.Context, _ string, c *coordinator.Control) error { h.killed(c.JobID); return nil })

	queued := h.start(map[string]any{"command": "sleep 10"}).Job.ID
	var k struct{ Job job }
	r := h.post("/v1/jobs/"+queued+"/kill", nil)
	r.decode(t, &k)
	if r.status != 202 || k.Job.Status != "aborted" || k.Job.Reason != "killed" {
		t.Errorf("kill queued: %d %s", r.status, r.body)
	}
	h.post("/v1/jobs/"+queued+"/kill", nil).wantError(t, 409, "conflict", "ended")

	h.startOnly()
	running := h.start(map[string]any{"command": "sleep 10"}).Job.ID
	h.post("/v1/jobs/"+running+"/kill", `{"signal":"BOGUS"}`).wantError(t, 400, "invalid", "signal")
	h.post("/v1/jobs/"+running+"/kill", `{"sig":"TERM"}`).wantError(t, 400, "invalid", `unknown field "sig"`)
	r = h.post("/v1/jobs/"+running+"/kill", `{"signal":"TERM"}`)
	r.decode(t, &k)
	if r.status != 202 || k.Job.Status != "aborted" {
		t.Errorf("kill running: %d %s", r.status, r.body)
	}
	if c := h.disp.Controls(); len(c) != 1 || c[0].JobID != running || c[0].Op != "kill" {
		t.Errorf("controls %+v", c)
	}
}

func TestWait(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.startOnly()
	id := h.start(map[string]any{"command": "server"}).Job.ID
	h.output(id, 0, "booting\nlistening on :80\n")

	type waitReply struct {
		Job            job     `json:"job"`
		Done           bool    `json:"done"`
		PatternMatched bool    `json:"pattern_matched"`
		Matched        *string `json:"matched"`
		MatchedOffset  *int64  `json:"matched_offset"`
	}
	wait := func(query string) waitReply {
		t.Helper()
		r := h.get("/v1/jobs/" + id + "/wait" + query)
		if r.status != 200 {
			t.Fatalf("wait%s: %d %s", query, r.status, r.body)
		}
		var w waitReply
		r.decode(t, &w)
		return w
	}
	if w := wait("?timeout_ms=10000&pattern=" + url.QueryEscape("^listening on :\\d+")); !w.PatternMatched || w.Done ||
		w.Matched == nil || *w.Matched != "listening on :80" || w.MatchedOffset == nil || *w.MatchedOffset != 8 {
		t.Errorf("multiline pattern: %+v", w)
	}
	if w := wait("?timeout_ms=20&pattern=" + url.QueryEscape("^on")); w.PatternMatched || w.Done || w.Job.Status != "running" || w.Matched != nil {
		t.Errorf("no match: %+v", w)
	}
	// Above the maximum, a timeout is clamped as the agent tools do, not refused.
	if w := wait("?timeout_ms=99999999999&pattern=" + url.QueryEscape("listening")); !w.PatternMatched {
		t.Errorf("clamped timeout: %+v", w)
	}
	go func() {
		// The exit comes while the wait waits: nothing outside the service shows that it does, and
		// a wait begun late finds the job ended.
		time.Sleep(50 * time.Millisecond)
		h.exit(id, 3, 25)
	}()
	if w := wait("?timeout_ms=10000"); !w.Done || w.Job.Status != "failed" || *w.Job.ExitCode != 3 {
		t.Errorf("end: %+v", w)
	}

	for _, tt := range []struct{ query, want string }{
		{"?timeout_ms=-1", "timeout_ms"},
		{"?timeout_ms=soon", "timeout_ms"},
		{"?pattern=" + url.QueryEscape("(unclosed"), "pattern"},
		{"?pattern=" + strings.Repeat("a", 5000), "pattern"},
	} {
		h.get("/v1/jobs/"+id+"/wait"+tt.query).wantError(t, 400, "invalid", tt.want)
	}
}

func TestOutput(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.finishWith("0123456789", 0)
	id := h.start(map[string]any{"command": "seq", "block_until_ms": 5000}).Job.ID
	for _, tt := range []struct{ query, want string }{
		{"", "0123456789"},
		{"?offset=2&limit=3", "234"},
		{"?offset=8", "89"},
		{"?limit=0", ""},
		{"?offset=50", ""},
	} {
		r := h.get("/v1/jobs/" + id + "/output" + tt.query)
		if r.status != 200 || string(r.body) != tt.want || r.header.Get("Sbx-Output-Length") != "10" ||
			r.header.Get("Content-Type") != "application/octet-stream" {
			t.Errorf("%s: %d %q %v", tt.query, r.status, r.body, r.header)
		}
	}
	for _, tt := range []struct{ query, want string }{
		{"?offset=-1", "offset"},
		{"?offset=x", "offset"},
		{"?limit=-5", "limit"},
		{"?follow=maybe", "follow"},
		{"?follow=true&limit=3", "limit"},
	} {
		h.get("/v1/jobs/"+id+"/output"+tt.query).wantError(t, 400, "invalid", tt.want)
	}
}

func TestFollow(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.startOnly()
	id := h.start(map[string]any{"command": "build"}).Job.ID
	h.output(id, 0, "line 1\n")

	resp, err := http.Get(h.url + "/v1/jobs/" + id + "/output?follow=true&offset=2")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Sbx-Output-Length") != "7" {
		t.Errorf("Sbx-Output-Length %q", resp.Header.Get("Sbx-Output-Length"))
	}
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || first != "ne 1\n" {
		t.Fatalf("first chunk %q, %v", first, err)
	}
	h.output(id, 7, "line 2\n")
	second, err := br.ReadString('\n')
	if err != nil || second != "line 2\n" {
		t.Fatalf("second chunk %q, %v", second, err)
	}
	h.output(id, 14, "line 3\n")
	h.exit(id, 0, 21)
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "line 3\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}
}

// TestSleep: GET /v1/wait without a job sleeps timeout_ms (AwaitShell without a shell).
func TestSleep(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	t0 := time.Now()
	r := h.get("/v1/wait?timeout_ms=80")
	var reply struct {
		SleptMS *int64 `json:"slept_ms"`
	}
	r.decode(t, &reply)
	if r.status != 200 || reply.SleptMS == nil || *reply.SleptMS < 80 || time.Since(t0) < 80*time.Millisecond {
		t.Errorf("sleep: %d %s after %s", r.status, r.body, time.Since(t0))
	}
	h.get("/v1/wait?timeout_ms=-5").wantError(t, 400, "invalid", "timeout_ms")
}
