package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/coordinatortest"
	"github.com/sbx-dev/sbx/coordinator/httpapi"
	"github.com/sbx-dev/sbx/coordinator/store"
	"github.com/sbx-dev/sbx/proto"
)

// harness is a real Service on the real store, behind the real handler.
type harness struct {
	t    *testing.T
	svc  *coordinator.Service
	disp *coordinatortest.Dispatcher
	url  string
	cwd  string
}

func newHarness(t *testing.T, cfg httpapi.Config) *harness {
	t.Helper()
	return newHarnessWith(t, cfg, coordinator.Config{})
}

// newHarnessWith is newHarness with the coordinator's settings ccfg.
func newHarnessWith(t *testing.T, cfg httpapi.Config, ccfg coordinator.Config) *harness {
	t.Helper()
	dir := t.TempDir()
	db, err := store.Open(dir + "/db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	terms, err := store.OpenTerminals(dir + "/terminals")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { terms.Close() })
	disp := &coordinatortest.Dispatcher{}
	disp.SetWithdraw(true)
	svc, err := coordinator.New(t.Context(), ccfg, db, terms, disp)
	if err != nil {
		t.Fatal(err)
	}
	// Every exchange of the tests is checked against the API's OpenAPI document (openapi_test.go).
	srv := httptest.NewServer(checkContract(t, httpapi.NewServer(svc, cfg).Handler(), func(err error) { t.Error(err) }))
	t.Cleanup(srv.Close)
	return &harness{t: t, svc: svc, disp: disp, url: srv.URL, cwd: t.TempDir()}
}

// heartbeat makes runner r1 of the default pool known.
func (h *harness) heartbeat() {
	h.svc.HandleHeartbeat(&coordinator.Heartbeat{
		Runner: "r1", Pool: "default", Slots: 4, Readonly: true, Cgroup: "/sbx",
		Version: "test", Boot: time.Now(), Labels: map[string]string{"os": "linux"},
	})
}

func (h *harness) event(e *coordinator.Event) {
	h.t.Helper()
	e.Runner = "r1"
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if err := h.svc.HandleEvent(context.Background(), coordinatortest.Claimed(h.svc, e)); err != nil {
		h.t.Error(err)
	}
}

// begin plays "accepted" and "started" for a job.
func (h *harness) begin(id string) {
	h.event(&coordinator.Event{Kind: proto.EventAccepted, JobID: id})
	h.event(&coordinator.Event{Kind: proto.EventStarted, JobID: id, Pid: 4242})
}

// output appends data at offset.
func (h *harness) output(id string, offset int64, data string) {
	h.t.Helper()
	if err := h.svc.HandleChunk(context.Background(), coordinatortest.ClaimedChunk(h.svc, &coordinator.Chunk{JobID: id, Offset: offset, Data: []byte(data)})); err != nil {
		h.t.Error(err)
	}
}

// exit plays the end of a job whose output was size bytes.
func (h *harness) exit(id string, code int, size int64) {
	h.event(&coordinator.Event{
		Kind: proto.EventExited, JobID: id, Reason: proto.ReasonExit, ExitCode: &code,
		OutputBytes: size, Usage: &coordinator.Usage{CPUMS: 12, MemoryPeakBytes: 1 << 20},
	})
}

// killed plays the end of a job killed by its runner.
func (h *harness) killed(id string) {
	h.event(&coordinator.Event{Kind: proto.EventExited, JobID: id, Reason: proto.ReasonKilled})
}

// finishWith makes every dispatched job run at once, print out and exit with code.
func (h *harness) finishWith(out string, code int) {
	h.disp.SetRun(func(w *coordinator.Work) {
		h.begin(w.JobID)
		h.output(w.JobID, 0, out)
		h.exit(w.JobID, code, int64(len(out)))
	})
}

// startOnly makes every dispatched job start and keep running.
func (h *harness) startOnly() {
	h.disp.SetRun(func(w *coordinator.Work) { h.begin(w.JobID) })
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r *reply) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

// apiError is the API's error body.
type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// wantError checks the status, the code and that the message names want.
func (r *reply) wantError(t *testing.T, status int, code, want string) {
	t.Helper()
	if r.status != status {
		t.Errorf("status %d, want %d; body %s", r.status, status, r.body)
	}
	var e apiError
	r.decode(t, &e)
	if e.Error.Code != code || !strings.Contains(e.Error.Message, want) {
		t.Errorf("error %+v, want code %s and a message with %q", e.Error, code, want)
	}
}

func (h *harness) do(method, path string, body io.Reader, header ...string) *reply {
	h.t.Helper()
	req, err := http.NewRequestWithContext(h.t.Context(), method, h.url+path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1] // net/http sends req.Host, not a Host in the header map
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return &reply{status: resp.StatusCode, header: resp.Header, body: data}
}

func (h *harness) get(path string, header ...string) *reply { return h.do("GET", path, nil, header...) }

func (h *harness) post(path string, body any, header ...string) *reply {
	h.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			h.t.Fatal(err)
		}
		r = bytes.NewReader(data)
	}
	if r != nil {
		// A body needs its Content-Type; a later header argument may replace it.
		header = append([]string{"Content-Type", "application/json"}, header...)
	}
	return h.do("POST", path, r, header...)
}

// job is the part of the job object the tests look at; raw keeps all of it.
type job struct {
	ID          string          `json:"id"`
	Session     string          `json:"session"`
	Title       string          `json:"title"`
	Status      string          `json:"status"`
	Reason      string          `json:"reason"`
	ExitCode    *int            `json:"exit_code"`
	Pid         *int            `json:"pid"`
	OutputBytes int64           `json:"output_bytes"`
	Limits      map[string]any  `json:"limits"`
	Usage       json.RawMessage `json:"usage"`
	ToolCallID  string          `json:"tool_call_id"`
}

type startReply struct {
	Job          job    `json:"job"`
	Output       string `json:"output"`
	Backgrounded bool   `json:"backgrounded"`
}

// start starts a job and returns its reply; it fails the test unless the status is 201.
func (h *harness) start(body map[string]any, header ...string) *startReply {
	h.t.Helper()
	if _, ok := body["cwd"]; !ok {
		body["cwd"] = h.cwd
	}
	r := h.post("/v1/jobs", body, header...)
	if r.status != http.StatusCreated {
		h.t.Fatalf("start: status %d: %s", r.status, r.body)
	}
	var s startReply
	r.decode(h.t, &s)
	return &s
}

func TestRoutes(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	tests := []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/v2/nothing", 404, "not_found"},
		{"GET", "/v1/jobs/x/y/z", 404, "not_found"},
		{"DELETE", "/v1/jobs", 405, "method_not_allowed"},
		{"POST", "/v1/runners", 405, "method_not_allowed"},
		{"GET", "/v1/jobs/x/kill", 405, "method_not_allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			r := h.do(tt.method, tt.path, nil)
			r.wantError(t, tt.status, tt.code, "")
			if tt.status == 405 && r.header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
		})
	}
}

func TestAuth(t *testing.T) {
	h := newHarness(t, httpapi.Config{Token: "s3cret"})
	tests := []struct {
		name, path, auth string
		status           int
	}{
		{"no token", "/v1/jobs", "", 401},
		{"wrong token", "/v1/jobs", "Bearer nope", 401},
		{"not bearer", "/v1/jobs", "s3cret", 401},
		{"unknown path", "/v2/x", "", 401},
		{"right token", "/v1/jobs", "Bearer s3cret", 200},
		{"healthz open", "/healthz", "", 200},
		{"metrics open", "/metrics", "", 200},
		{"readyz open", "/readyz", "", 503},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r *reply
			if tt.auth == "" {
				r = h.get(tt.path)
			} else {
				r = h.get(tt.path, "Authorization", tt.auth)
			}
			if tt.status == 401 {
				r.wantError(t, 401, "unauthorized", "Bearer")
			} else if r.status != tt.status {
				t.Errorf("status %d, want %d: %s", r.status, tt.status, r.body)
			}
		})
	}
}

func TestHealth(t *testing.T) {
	var readyErr error
	h := newHarness(t, httpapi.Config{Version: "v1.2.3", Ready: func(context.Context) error { return readyErr }})

	r := h.get("/healthz")
	if r.status != 200 || !strings.Contains(string(r.body), `"status":"ok"`) {
		t.Errorf("healthz: %d %s", r.status, r.body)
	}
	h.get("/readyz").wantError(t, 503, "unavailable", "no runner")
	h.heartbeat()
	r = h.get("/readyz")
	if r.status != 200 {
		t.Errorf("readyz with a runner: %d %s", r.status, r.body)
	}
	// A single coordinator leads, and names no other.
	var ready map[string]any
	r.decode(t, &ready)
	if _, named := ready["leader_id"]; ready["leader"] != true || named {
		t.Errorf("readyz of a single coordinator: %s", r.body)
	}
	readyErr = errors.New("NATS is not connected")
	h.get("/readyz").wantError(t, 503, "unavailable", "NATS is not connected")

	// No job can start on a disk short of free space: not ready, though everything is connected.
	h = newHarnessWith(t, httpapi.Config{}, coordinator.Config{MinFreeBytes: 1 << 62})
	h.heartbeat()
	h.get("/readyz").wantError(t, 503, "unavailable", "--min-free-disk")
}

// TestRole: /readyz and /metrics say whether this coordinator leads, and which does.
func TestRole(t *testing.T) {
	var leading bool
	h := newHarness(t, httpapi.Config{Role: func() (bool, string) {
		if leading {
			return true, "c1"
		}
		return false, "c2"
	}})
	h.heartbeat()
	for _, leading = range []bool{false, true} {
		var ready struct {
			Leader   bool   `json:"leader"`
			LeaderID string `json:"leader_id"`
		}
		h.get("/readyz").decode(t, &ready)
		if want := map[bool]string{false: "c2", true: "c1"}[leading]; ready.Leader != leading || ready.LeaderID != want {
			t.Errorf("readyz while leading %v: leader %v leader_id %q, want %q", leading, ready.Leader, ready.LeaderID, want)
		}
		want := "sbx_coordinator_leader 0\n"
		if leading {
			want = "sbx_coordinator_leader 1\n"
		}
		if r := h.get("/metrics"); !strings.Contains(string(r.body), want) {
			t.Errorf("metrics while leading %v lack %q:\n%s", leading, want, r.body)
		}
	}
}

func TestRunners(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	if r := h.get("/v1/runners"); r.status != 200 || strings.TrimSpace(string(r.body)) != "[]" {
		t.Errorf("no runners: %d %s", r.status, r.body)
	}
	h.heartbeat()
	var runners []map[string]any
	h.get("/v1/runners").decode(t, &runners)
	if len(runners) != 1 {
		t.Fatalf("runners %v", runners)
	}
	for _, k := range []string{"id", "pool", "slots", "running", "readonly", "readonly_reason", "cgroup", "labels", "last_seen", "version"} {
		if _, ok := runners[0][k]; !ok {
			t.Errorf("runner lacks %q: %v", k, runners[0])
		}
	}
	if runners[0]["id"] != "r1" || runners[0]["slots"] != 4.0 {
		t.Errorf("runner %v", runners[0])
	}
}

func TestMetrics(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.heartbeat()
	h.finishWith("hi\n", 1)
	h.start(map[string]any{"command": "false", "block_until_ms": 1000})
	h.get("/v1/jobs/nope")
	r := h.get("/metrics")
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("Content-Type %q", ct)
	}
	for _, want := range []string{
		"sbx_jobs_started_total 1\n",
		`sbx_jobs_ended_total{status="failed"} 1` + "\n",
		`sbx_jobs_ended_total{status="succeeded"} 0` + "\n",
		"sbx_jobs_live 0\n",
		"sbx_runners 1\n",
		"sbx_events_total 3\n",
		"sbx_output_bytes_total 3\n",
		`sbx_http_requests_total{code="201"} 1` + "\n",
		`sbx_http_requests_total{code="404"} 1` + "\n",
		"# TYPE sbx_http_requests_total counter\n",
		`sbx_forged_events_total{kind="output"} 0` + "\n",
		"sbx_coordinator_leader 1\n",
	} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("metrics lack %q:\n%s", want, r.body)
		}
	}

	// Output with a wrong claim is refused and counted.
	h.startOnly()
	id := h.start(map[string]any{"command": "sleep 100"}).Job.ID
	forged := &coordinator.Chunk{Runner: "r1", JobID: id, Claim: "0000000000000000", Offset: 0, Data: []byte("forged")}
	if err := h.svc.HandleChunk(t.Context(), forged); !errors.Is(err, coordinator.ErrForged) {
		t.Fatalf("a chunk with a wrong claim: %v, want ErrForged", err)
	}
	if r := h.get("/metrics"); !strings.Contains(string(r.body), `sbx_forged_events_total{kind="output"} 1`+"\n") {
		t.Errorf("the forged chunk is not counted:\n%s", r.body)
	}
}

// TestOpenClose serves on a real listener and checks that Close ends a wait in progress.
func TestOpenClose(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.startOnly()
	id := h.start(map[string]any{"command": "sleep 1000"}).Job.ID

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := httpapi.NewServer(h.svc, httpapi.Config{})
	s.Open(ln)
	url := "http://" + ln.Addr().String()
	resp, err := http.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	done := make(chan int)
	go func() {
		resp, err := http.Get(url + "/v1/jobs/" + id + "/wait?timeout_ms=600000")
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	time.Sleep(100 * time.Millisecond) // let the wait begin
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != http.StatusServiceUnavailable && code != 0 {
			t.Errorf("wait cut by Close: status %d", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("wait still running after Close")
	}
}

// TestPathIDs: ids in paths are tokens, and a path with dot segments is not redirected to another
// route: `sbx status ../../healthz` once reached /healthz.
func TestPathIDs(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	for _, tt := range []struct {
		method, path string
		status       int
		code, want   string
	}{
		{"GET", "/v1/jobs/..%2F..%2Fhealthz", 400, "invalid", `job id "../../healthz"`},
		{"GET", "/v1/jobs/%2E%2E", 400, "invalid", `job id ".."`},
		{"GET", "/v1/jobs/no%20such/wait", 400, "invalid", `job id "no such"`},
		{"GET", "/v1/jobs/a.b/output", 400, "invalid", `job id "a.b"`},
		{"POST", "/v1/jobs/%2E/kill", 400, "invalid", `job id "."`},
		{"POST", "/v1/jobs/..%2Fx/stdin", 400, "invalid", `job id "../x"`},
		{"GET", "/v1/sessions/a%2Fb", 400, "invalid", `session id "a/b"`},
		{"POST", "/v1/sessions/%2E%2E/renew", 400, "invalid", `session id ".."`},
		{"DELETE", "/v1/sessions/a%20b", 400, "invalid", `session id "a b"`},
		{"GET", "/v1/jobs/../../healthz", 404, "not_found", "No endpoint"},
		{"GET", "/v1/jobs/.", 404, "not_found", "No endpoint"},
		{"GET", "/v1//jobs", 404, "not_found", "No endpoint"},
		{"DELETE", "/v1/sessions/x/../../jobs/y", 404, "not_found", "No endpoint"},
	} {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			// Sent as it is: net/http's client does not clean paths.
			h.do(tt.method, tt.path, nil).wantError(t, tt.status, tt.code, tt.want)
		})
	}
}

// TestServe: Serve returns nil when its context ends, and an error at once when serving stops by
// itself, so that a supervisor sees it.
func TestServe(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	for _, stop := range []string{"context", "listener"} {
		t.Run(stop, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- httpapi.NewServer(h.svc, httpapi.Config{}).Serve(ctx, ln) }()
			resp, err := http.Get("http://" + ln.Addr().String() + "/healthz")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if stop == "context" {
				cancel()
			} else {
				ln.Close()
			}
			select {
			case err := <-done:
				if (err != nil) != (stop == "listener") {
					t.Errorf("Serve stopped by its %s: %v", stop, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("Serve still running after its %s stopped", stop)
			}
		})
	}
}

// TestCloseCutsStuckHandlers: a mounted handler that ignores its request's context cannot hold
// Close past its grace: the connection is cut and Close reports no error.
func TestCloseCutsStuckHandlers(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.startOnly()
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{})
	s := httpapi.NewServer(h.svc, httpapi.Config{Handlers: map[string]http.Handler{
		"/stuck": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			close(entered)
			<-release // ignores r.Context()
		}),
	}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Open(ln)
	got := make(chan error, 1)
	go func() {
		resp, err := http.Get("http://" + ln.Addr().String() + "/stuck")
		if err == nil {
			resp.Body.Close()
		}
		got <- err
	}()
	<-entered
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Fatalf("Close = %v, want the stuck connection cut and no error", err)
	}
	select {
	case err := <-got:
		if err == nil {
			t.Error("the stuck request got an answer, want its connection cut")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stuck request's connection was not cut")
	}
}
