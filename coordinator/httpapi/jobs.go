package httpapi

import (
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/api"
	"github.com/sbx-dev/sbx/proto"
)

// MaxPatternBytes bounds a wait's pattern.
const MaxPatternBytes = 4096

// startBody is the body of POST /v1/jobs: api.StartRequest, with block_until_ms read as it is
// sent (a huge value would overflow the request's time.Duration).
type startBody struct {
	api.StartRequest
	BlockUntilMS int64 `json:"block_until_ms"`
}

func (s *Server) handleStart(w http.ResponseWriter, r *http.Request) {
	var b startBody
	err := decodeBody(r, &b, false)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// Checked here as well as in the domain: a huge value would overflow time.Duration.
	if b.BlockUntilMS < 0 {
		s.writeError(w, r, invalid("block_until_ms must not be negative."))
		return
	}
	b.BlockUntilMS = min(b.BlockUntilMS, coordinator.MaxBlockUntil.Milliseconds())
	if b.Session, err = session(r, b.Session); err != nil {
		s.writeError(w, r, err)
		return
	}
	switch {
	case b.ToolCallID == "":
		b.ToolCallID = b.ToolUseID
	case b.ToolUseID != "" && b.ToolUseID != b.ToolCallID:
		s.writeError(w, r, invalid("tool_call_id and tool_use_id name the same thing: give one."))
		return
	}
	var notify *coordinator.OutputNotify
	if n := b.NotifyOnOutput; n != nil {
		// Checked here as well as in the domain: a huge value would overflow time.Duration.
		if n.DebounceMS < 0 {
			s.writeError(w, r, invalid("notify_on_output.debounce_ms must not be negative."))
			return
		}
		notify = &coordinator.OutputNotify{Pattern: n.Pattern, Reason: n.Reason, DebounceMS: n.DebounceMS}
	}
	if b.Session != "" {
		s.svc.TouchSession(b.Session)
	}
	var source *coordinator.Source
	if b.Source != nil {
		source = &coordinator.Source{WS: b.Source.WS}
	}
	var ttySize *coordinator.TTYSize
	if b.TTYSize != nil {
		ttySize = &coordinator.TTYSize{Rows: b.TTYSize.Rows, Cols: b.TTYSize.Cols}
	}
	var limits coordinator.Limits
	if l := b.Limits; l != nil {
		limits = coordinator.Limits{
			MemoryBytes: l.MemoryBytes, CPUMillicores: l.CPUMillicores,
			Pids: l.Pids, OutputBytes: l.OutputBytes, TimeoutMS: l.TimeoutMS,
		}
	}
	// A header given empty is a bad key, not none: the caller meant to send one.
	key, keyed := r.Header[api.HeaderIdempotencyKey]
	if keyed && (len(key) != 1 || !coordinator.ValidIdempotencyKey(key[0])) {
		s.writeError(w, r, invalid("Idempotency-Key must be one header of 1 to %d printable ASCII characters.", coordinator.MaxIdempotencyKey))
		return
	}
	req := coordinator.StartRequest{
		TTY: b.TTY, TTYSize: ttySize,
		Source: source, NotifyOnOutput: notify, Monitor: b.Monitor, Persistent: b.Persistent,
		Command: b.Command, Cwd: b.Cwd, Title: b.Title, Env: b.Env, Readonly: b.Readonly, User: b.User, Shell: b.Shell, Linger: b.Linger, LingerCgroup: b.LingerCgroup, Stdin: b.Stdin,
		Pool: b.Pool, Session: b.Session, BlockUntil: time.Duration(b.BlockUntilMS) * time.Millisecond, Limits: limits,
		NotificationFormat: coordinator.Format(b.NotificationFormat), ToolCallID: b.ToolCallID,
	}
	var res *coordinator.StartResult
	if keyed {
		res, err = s.svc.StartOnce(r.Context(), key[0], req)
	} else {
		res, err = s.svc.Start(r.Context(), req)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// 201 for the start that created the job, 200 for a repeat of it: the same job, nothing made.
	status := http.StatusCreated
	if res.Replayed {
		status = http.StatusOK
	}
	reply := api.StartReply{
		Job: viewJob(res.Job, time.Now()), Output: string(res.Output), Backgrounded: res.Backgrounded,
		OutputTruncated: res.OutputTruncated, OutputBytes: res.OutputBytes, OutputLines: res.OutputLines, OutputTotalLines: res.TotalLines,
	}
	if !res.Accepted.IsZero() {
		reply.ReplyUS = stage(max(time.Since(res.Accepted).Microseconds(), 1))
	}
	writeJSON(w, status, reply)
}

func (s *Server) handleJob(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "job")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	job, err := s.svc.Job(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewJob(job, time.Now()))
}

func (s *Server) handleJobs(w http.ResponseWriter, r *http.Request) {
	limit, err := queryInt(r, "limit", 0, 1, 1000)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	q := r.URL.Query()
	// Without a session, every session's jobs: for a scoped token, those of its scope.
	f := coordinator.JobFilter{Status: coordinator.Status(q.Get("status")), Limit: int(limit), SessionPrefix: scopeOf(r.Context())}
	if sess := q.Get("session"); sess != "" {
		if f.Session, err = session(r, sess); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	jobs, err := s.svc.Jobs(r.Context(), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	now := time.Now()
	reply := api.JobsReply{Jobs: make([]api.Job, 0, len(jobs))}
	for _, j := range jobs {
		reply.Jobs = append(reply.Jobs, viewJob(j, now))
	}
	writeJSON(w, http.StatusOK, reply)
}

// handleWait is AwaitShell: it returns when the job ends, when pattern matches its output, or at
// the timeout. The pattern is RE2 in multiline mode: ^ and $ match at line boundaries.
func (s *Server) handleWait(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "job")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	timeout, err := waitTimeout(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var cond coordinator.WaitCond
	if p := r.URL.Query().Get("pattern"); p != "" {
		if cond.Pattern, err = compilePattern(p); err != nil {
			s.writeError(w, r, err)
			return
		}
	}
	if cond.Port, cond.AnyPort, err = waitPort(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.svc.WaitFor(r.Context(), id, time.Duration(timeout)*time.Millisecond, cond)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	reply := api.WaitReply{Job: viewJob(res.Job, time.Now()), Done: res.Done, PatternMatched: res.PatternMatched}
	if res.PatternMatched {
		reply.Matched, reply.MatchedOffset = &res.Matched, &res.MatchedOffset
	}
	if res.Port != nil {
		reply.Port = &api.Port{Address: res.Port.Address, Port: res.Port.Port}
	}
	writeJSON(w, http.StatusOK, reply)
}

// waitPort reads a wait's port: a TCP port number, or "any".
func waitPort(r *http.Request) (port int, anyPort bool, err error) {
	switch p := r.URL.Query().Get("port"); p {
	case "":
		return 0, false, nil
	case "any":
		return 0, true, nil
	default:
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return 0, false, invalid("port %q must be a TCP port (1-65535) or any.", p)
		}
		return n, false, nil
	}
}

// waitTimeout reads a wait's timeout_ms: default coordinator.DefaultWait, clamped to
// coordinator.MaxWaitTimeout as the agent tools do.
func waitTimeout(r *http.Request) (int64, error) {
	timeout, err := queryInt(r, "timeout_ms", coordinator.DefaultWait.Milliseconds(), 0, math.MaxInt64)
	return min(timeout, coordinator.MaxWaitTimeout.Milliseconds()), err
}

// handleSleep is AwaitShell without a shell: it returns after timeout_ms (default 30000, clamped as
// a wait's), or earlier when the client goes away.
func (s *Server) handleSleep(w http.ResponseWriter, r *http.Request) {
	timeout, err := waitTimeout(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	start := time.Now()
	t := time.NewTimer(time.Duration(timeout) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		return
	}
	writeJSON(w, http.StatusOK, api.SleepReply{SleptMS: time.Since(start).Milliseconds()})
}

func compilePattern(p string) (*regexp.Regexp, error) {
	if len(p) > MaxPatternBytes {
		return nil, invalid("pattern is %d bytes; the limit is %d.", len(p), MaxPatternBytes)
	}
	// Compiled alone first so that the error quotes the client's pattern, not ours.
	if _, err := regexp.Compile(p); err != nil {
		return nil, invalid("pattern is not a valid RE2 expression: %v.", err)
	}
	re, err := regexp.Compile("(?m)" + p)
	if err != nil {
		return nil, invalid("pattern is not a valid RE2 expression: %v.", err)
	}
	return re, nil
}

// handleOutput sends the output's bytes from offset: at most limit of what there is now, or with
// follow=true everything until the job ends (chunked, flushed as it comes). Sbx-Output-Length is
// the output's size when the reply starts.
func (s *Server) handleOutput(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "job")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	offset, err := queryInt(r, "offset", 0, 0, proto.MaxOutputBytes)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	limit, err := queryInt(r, "limit", -1, 0, proto.MaxOutputBytes)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	follow, err := queryBool(r, "follow")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if follow && limit >= 0 {
		s.writeError(w, r, invalid("limit cannot be combined with follow=true."))
		return
	}
	if follow {
		limit = 0 // only the size and the job's existence, checked before the reply starts
	}
	rc, size, err := s.svc.Output(r.Context(), id, offset, limit)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set(api.HeaderOutputLength, strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
	if !follow {
		if _, err := io.Copy(w, rc); err != nil {
			s.log.Debug("send output", "job", id, "err", err)
		}
		return
	}
	ctl := http.NewResponseController(w)
	flush := func() { _ = ctl.Flush() } // a failed flush means the client left; Follow's next write fails
	flush()
	err = s.svc.Follow(r.Context(), id, offset, w, flush)
	if err != nil && r.Context().Err() == nil {
		s.log.Warn("follow output", "job", id, "err", err)
	}
	if err != nil || r.Context().Err() != nil {
		// The stream ends cleanly only after the job's last byte. Cut short (the server is closing,
		// or the output could not be read), it is aborted so that the client sees a broken stream
		// rather than an end.
		panic(http.ErrAbortHandler)
	}
}

func (s *Server) handleKill(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "job")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var b api.KillRequest
	if err := decodeBody(r, &b, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	from, err := session(r, b.Session)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// A kill from the job's own session is observed: no finished notification follows.
	if err := s.svc.KillFrom(r.Context(), from, id, b.Signal); err != nil {
		s.writeError(w, r, err)
		return
	}
	job, err := s.svc.Job(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, api.JobReply{Job: viewJob(job, time.Now())})
}

// handleStdin writes to the standard input of a job started with stdin: true.
func (s *Server) handleStdin(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "job")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var b api.StdinRequest
	if err := decodeBody(r, &b, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if b.Data == "" && !b.Close {
		s.writeError(w, r, invalid("data is empty and close is false: send text, or close: true for EOF."))
		return
	}
	if err := s.svc.Input(r.Context(), id, []byte(b.Data), b.Close); err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.StdinReply{Written: len(b.Data), Closed: b.Close})
}

// handleResize sets the size of a tty job's terminal: 202 with the job, 409 for a job that ended or
// has no terminal, 400 naming the field for a size out of range.
func (s *Server) handleResize(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "job")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var b api.ResizeRequest
	if err := decodeBody(r, &b, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if b.Rows == nil {
		s.writeError(w, r, invalid("rows is required."))
		return
	}
	if b.Cols == nil {
		s.writeError(w, r, invalid("cols is required."))
		return
	}
	if err := s.svc.Resize(r.Context(), id, coordinator.TTYSize{Rows: *b.Rows, Cols: *b.Cols}); err != nil {
		s.writeError(w, r, err)
		return
	}
	job, err := s.svc.Job(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, api.JobReply{Job: viewJob(job, time.Now())})
}
