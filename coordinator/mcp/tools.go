package mcp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbx-dev/sbx/coordinator/api"
	"github.com/sbx-dev/sbx/coordinator/client"
)

const (
	// defaultWait is wait's timeout when the call gives none, the API's default.
	defaultWait = 30 * time.Second
	// listLimit is how many jobs list shows when the call does not say.
	listLimit = 20
)

// Tool inputs. Every field but the ids and the command is optional: the JSON schema the SDK derives
// marks a field required unless it is omitempty.
type (
	startInput struct {
		Command            string            `json:"command" jsonschema:"the shell command, run with bash -c (sh -c where the runner has no bash, or with shell sh); e.g. \"make test 2>&1\" or \"npm run dev\""`
		Cwd                string            `json:"cwd,omitempty" jsonschema:"absolute directory to run in; default: the directory sbx mcp was started in (required over HTTP)"`
		Title              string            `json:"title,omitempty" jsonschema:"short title shown in notifications; default: the command's first line"`
		Env                map[string]string `json:"env,omitempty" jsonschema:"variables added to the environment"`
		Readonly           bool              `json:"readonly,omitempty" jsonschema:"run sandboxed: reads work, no file is written, no network; for commands you do not trust"`
		Shell              string            `json:"shell,omitempty" jsonschema:"bash (the default where the runner has it) or sh"`
		User               string            `json:"user,omitempty" jsonschema:"user to run as, among those the runner allows (default: the runner's)"`
		Stdin              bool              `json:"stdin,omitempty" jsonschema:"give the job an input that the send tool writes to (default: /dev/null); for commands that ask questions"`
		TTY                bool              `json:"tty,omitempty" jsonschema:"run on a pseudo-terminal (24x80): prompts that need a terminal show, and the send tool types on it; notifications and patterns see the text without escape sequences"`
		Linger             bool              `json:"linger,omitempty" jsonschema:"keep the job until its output closes, not only until the shell exits: for a command that starts background children whose output you want"`
		LingerCgroup       bool              `json:"linger_cgroup,omitempty" jsonschema:"keep the job until every process it started has exited, a daemon started with nohup or setsid and its output redirected too: it stays a job you can wait on and kill"`
		Pool               string            `json:"pool,omitempty" jsonschema:"pool of runners (default: default)"`
		Session            string            `json:"session,omitempty" jsonschema:"session of the job (default: this connection's)"`
		Limits             *limitsInput      `json:"limits,omitempty" jsonschema:"resource limits; each field is optional, 0 or absent is the default"`
		BlockUntilMS       int64             `json:"block_until_ms,omitempty" jsonschema:"wait up to this long for the job to end and return its exit code and output; 0 or absent returns at once with the job id. One call waits at most about 50 s and then returns a continuation (call wait with the id)"`
		NotifyOnOutput     *notifyOnInput    `json:"notify_on_output,omitempty" jsonschema:"send a notification when an output line matches a pattern, e.g. {\"pattern\":\"FAIL|panic\"}"`
		Monitor            bool              `json:"monitor,omitempty" jsonschema:"every output line becomes a notification (for a tail -f or a log watcher filtered to what matters); stopped if it prints more than 200 lines in 10 s"`
		Persistent         bool              `json:"persistent,omitempty" jsonschema:"with monitor: no default 30-minute timeout"`
		NotificationFormat string            `json:"notification_format,omitempty" jsonschema:"text format of the job's notifications: system_notification or task_notification (Claude Code's); default: the session's"`
	}
	limitsInput struct {
		MemoryBytes   int64 `json:"memory_bytes,omitempty" jsonschema:"memory limit in bytes (at least 4 MiB)"`
		CPUMillicores int64 `json:"cpu_millicores,omitempty" jsonschema:"CPU limit in thousandths of a CPU (1500 = 1.5 CPUs)"`
		Pids          int64 `json:"pids,omitempty" jsonschema:"limit on processes"`
		OutputBytes   int64 `json:"output_bytes,omitempty" jsonschema:"end the job (reason output_limit) past this much output (default 1 GiB)"`
		TimeoutMS     int64 `json:"timeout_ms,omitempty" jsonschema:"end the job (reason timeout) after this many milliseconds (default: none)"`
	}
	notifyOnInput struct {
		Pattern    string `json:"pattern" jsonschema:"RE2 pattern matched against each output line"`
		Reason     string `json:"reason,omitempty" jsonschema:"why, quoted in the notification (default: the pattern)"`
		DebounceMS int64  `json:"debounce_ms,omitempty" jsonschema:"matches within this window after the first are counted and sent as one (default and minimum 5000)"`
	}
	jobInput struct {
		ID string `json:"id" jsonschema:"the job id, as run returned it"`
	}
	listInput struct {
		Session string `json:"session,omitempty" jsonschema:"only this session's jobs"`
		Status  string `json:"status,omitempty" jsonschema:"only jobs in this status: queued, running, succeeded, failed or aborted"`
		Limit   int    `json:"limit,omitempty" jsonschema:"at most this many, newest first (default 20, at most 1000)"`
	}
	waitInput struct {
		ID        string `json:"id,omitempty" jsonschema:"the job id; without one, wait just sleeps timeout_ms (to give something outside sbx time)"`
		TimeoutMS *int64 `json:"timeout_ms,omitempty" jsonschema:"give up after this many milliseconds (default 30000, at most 7140000); one call waits at most about 50 s and returns a continuation with the time left"`
		Pattern   string `json:"pattern,omitempty" jsonschema:"return as soon as this RE2 pattern matches the output so far (^ and $ match at line ends), e.g. \"listening on|ready\""`
		Offset    int64  `json:"offset,omitempty" jsonschema:"show output from this byte on (the output_end of the previous result), at most its last 30 KiB"`
		Port      string `json:"port,omitempty" jsonschema:"return as soon as the job listens on this TCP port, e.g. \"5173\", or on any: \"any\" (for a server: ready when it listens)"`
	}
	outputInput struct {
		ID     string `json:"id" jsonschema:"the job id"`
		Offset int64  `json:"offset,omitempty" jsonschema:"first byte to return (default 0)"`
		Limit  int64  `json:"limit,omitempty" jsonschema:"at most this many bytes (default 30720, at most 262144)"`
	}
	sendInput struct {
		ID    string `json:"id" jsonschema:"the job id; the job must have been started with stdin: true or tty: true"`
		Text  string `json:"text,omitempty" jsonschema:"bytes written as they are: end with \n to answer a prompt, e.g. \"y\\n\" (at most 64 KiB)"`
		Close bool   `json:"close,omitempty" jsonschema:"close the input after the text (end of file)"`
	}
	killInput struct {
		ID     string `json:"id" jsonschema:"the job id"`
		Signal string `json:"signal,omitempty" jsonschema:"TERM (default: TERM to every process of the job, KILL after 2 s), KILL, or INT, HUP, QUIT, USR1, USR2 (sent to the job's process group only; the job may go on)"`
	}
	notificationsInput struct {
		Session string  `json:"session,omitempty" jsonschema:"the session (default: this connection's)"`
		After   *uint64 `json:"after,omitempty" jsonschema:"list notifications after this seq (default: the session's acked cursor, i.e. the ones not acked yet)"`
		WaitMS  int64   `json:"wait_ms,omitempty" jsonschema:"wait up to this long for the first one (default 0, at most 300000); one call waits at most about 50 s"`
		Format  string  `json:"format,omitempty" jsonschema:"write each text as system_notification or task_notification (Claude Code's); default: as stored"`
	}
	ackInput struct {
		Session string `json:"session,omitempty" jsonschema:"the session (default: this connection's)"`
		Seq     uint64 `json:"seq" jsonschema:"every notification up to this seq has been acted on and is not listed again"`
	}
	sessionInput struct {
		Session string `json:"session" jsonschema:"the session id: the name that groups jobs and their notifications, given by run's session, by sbx mcp --session or the Sbx-Session header, else default"`
	}
	noInput struct{}
)

// JobResult is what run and wait return: the job, the end of its output and, when the call
// returned at its time budget with the job still running, the call to make next.
type JobResult struct {
	Job            *client.Job   `json:"job,omitempty" jsonschema:"the job (none for a wait without a job)"`
	SleptMS        int64         `json:"slept_ms,omitempty" jsonschema:"how long a wait without a job slept"`
	Done           bool          `json:"done" jsonschema:"the job has ended"`
	PatternMatched bool          `json:"pattern_matched,omitempty" jsonschema:"wait's pattern matched the output"`
	Matched        *string       `json:"matched,omitempty" jsonschema:"the text the pattern matched (at most 4096 bytes)"`
	MatchedOffset  *int64        `json:"matched_offset,omitempty" jsonschema:"where the match starts in the output"`
	Output         string        `json:"output" jsonschema:"the output bytes from output_offset to output_end"`
	OutputOffset   int64         `json:"output_offset" jsonschema:"byte offset of the first byte of output"`
	OutputEnd      int64         `json:"output_end" jsonschema:"byte offset after the last byte of output: the offset to read on from"`
	Next           *Continuation `json:"next,omitempty" jsonschema:"the call that goes on waiting, when this one returned at its time budget"`
	// Port is the address wait's port is listened on, once it is.
	Port *client.Port `json:"port,omitempty" jsonschema:"the address wait's port is listened on, once it is"`

	// note is the background shell tool's line above a cut output, when the lines are counted.
	note string
}

// Continuation is the call that goes on waiting: the tool to call next and its arguments.
type Continuation struct {
	Tool      string         `json:"tool"`
	Arguments map[string]any `json:"arguments"`
}

// OutputResult is a page of a job's output.
type OutputResult struct {
	Output string `json:"output"`
	Offset int64  `json:"offset" jsonschema:"byte offset of the first byte"`
	End    int64  `json:"end" jsonschema:"byte offset after the last byte: the offset to read on from"`
	Total  int64  `json:"total" jsonschema:"the output's size now"`
}

// tools implements the tools on a client of the API.
type tools struct {
	c   *client.Client
	cfg Config
}

func hint(b bool) *bool { return &b }

// register adds every tool to s.
func (t *tools) register(s *sdk.Server) {
	readOnly := &sdk.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: hint(false)}
	sdk.AddTool(s, &sdk.Tool{Name: "run", Annotations: &sdk.ToolAnnotations{Title: "Run a shell command", DestructiveHint: hint(true), OpenWorldHint: hint(true)},
		Description: `Run a shell command as a job, in the background or until it ends.

- Build, test, one-off command: set block_until_ms (e.g. 120000). The result has the exit code and the output's last 30 KiB. A job still running after about 50 s (the most one call waits) comes back with its id and a continuation: call wait as it says, until done.
- Server, watcher, anything that does not end: leave block_until_ms out; you get the job id at once. Then wait with a pattern for the line that says it is ready ({"id":ID,"pattern":"listening on"}), and kill it when done.
- notify_on_output {"pattern":"ERROR|FAIL"} sends a notification at each match (ONLY set it when the user asks for monitoring); monitor makes every line one.
A background job's end is notified (see the notifications tool) unless run or wait saw it: do not wait for that; keep working or end your turn. After a background start, do one status check (status, or the output file) to confirm it did not fail to start: a one-shot check, not a polling loop.
The job's output_path file starts with a header (pid, cwd, command, title, status, started_at, running_for_ms, refreshed every 5000 ms) and ends with a footer (exit_code, elapsed_ms, ended_at) once the command ends; on the coordinator's machine, ` + "`head -n 10 <dir>/*.txt`" + ` in its directory lists every job. Stop a job with kill, or ` + "`kill <pid>`" + ` with the header's pid. Limits are optional, e.g. {"timeout_ms":600000,"memory_bytes":2147483648}. readonly runs it sandboxed (no writes, no network).`},
		t.run)
	sdk.AddTool(s, &sdk.Tool{Name: "wait", Annotations: readOnly,
		Description: `Wait until a job ends, until its output matches a pattern, or until timeout_ms. Returns the job, whether it ended or matched, and its new output from offset (the last 30 KiB of it).

One call waits at most about 50 s; when the job is still running then and time is left, the result's "next" is the same call with the time left and the new offset: make it to go on waiting. Use a pattern to wait for a server to be up ({"id":ID,"pattern":"listening on|ready","timeout_ms":60000}) or for a step of a long job; the result has the matched text (the pattern matches the output, not the output file's header or footer). A wait that sees the job end means no notification of its end follows: if you think a job ended (e.g. you killed it from outside sbx), observe it with wait, because stale notifications confuse the user. Without an id, wait sleeps timeout_ms (prefer this to sleeping in the shell), in steps of at most 50 s as well.

Prefer NOT to poll reflexively. Multitask on independent work while jobs run, or end your turn and rely on the notification of their end. Wait only when your very next step is blocked on this job and you have nothing else to do, or when the job needs close monitoring: a long job that can hang, degrade or need a course correction (training and eval runs, deployments, long builds, data pipelines, migrations, large transfers). For fire-and-forget commands (tests, installs, dev servers and watchers, short scripts) the notification is enough.
When you do poll a job closely, do not stop until it ends, reaches a healthy steady state (a server or watcher), or is hung. Size timeout_ms to the expected runtime; when waiting further, avoid round 5-minute waits: prefer slices of 60–270 s (keeps the prompt cache warm) or 1200 s and more (one cache miss buys a long wait). If a job takes longer than expected and appears hung, kill it if that is safe (kill, or ` + "`kill <pid>`" + ` with the pid in its output file's header), fix the hang if you can, and proceed.`},
		t.wait)
	sdk.AddTool(s, &sdk.Tool{Name: "output", Annotations: readOnly,
		Description: `Read a job's output (stdout and stderr interleaved, as bytes) from a byte offset: at most limit bytes (default 30720). Use the offsets of run and wait results to read what they left out, or to read on from output_end as the job prints more. Returns at once; to wait for more output, use wait.`},
		t.output)
	sdk.AddTool(s, &sdk.Tool{Name: "status", Annotations: readOnly,
		Description: `Show one job: status (queued, running, succeeded, failed, aborted), reason, exit_code, pid, runner, times, output_bytes, output_path, limits and usage.`},
		t.status)
	sdk.AddTool(s, &sdk.Tool{Name: "list", Annotations: readOnly,
		Description: `List jobs, newest first, optionally of one session or status, e.g. {"status":"running"} to find what is still going.`},
		t.list)
	sdk.AddTool(s, &sdk.Tool{Name: "kill", Annotations: &sdk.ToolAnnotations{Title: "Stop a job", DestructiveHint: hint(true), IdempotentHint: true, OpenWorldHint: hint(false)},
		Description: `Stop a job and every process it started (TERM to each, then KILL to whatever is left after 2 s). Returns the job. Killing a job that already ended is an error (conflict). Another signal (INT, HUP, ...) only reaches its process group.`},
		t.kill)
	sdk.AddTool(s, &sdk.Tool{Name: "send", Annotations: &sdk.ToolAnnotations{Title: "Write to a job's input", DestructiveHint: hint(true), OpenWorldHint: hint(false)},
		Description: `Write text to the input of a job started with stdin: true (or typed on its terminal, tty: true), e.g. to answer a prompt a "stall" notification reported ({"id":ID,"text":"y
"}), or feed a REPL; close: true ends the input (EOF). Text is written as it is: end it with a newline to send a line. A job without stdin, an ended one, or one that does not read within 3 s is an error. Then wait with offset to see what it printed.`},
		t.send)
	sdk.AddTool(s, &sdk.Tool{Name: "notifications", Annotations: readOnly,
		Description: `List the session's notifications not acked yet: jobs that ended in the background, output lines that matched notify_on_output, jobs that seem to wait at a prompt, monitor lines. Each has a seq and a <system_notification> text. They are also pushed as they happen; this is the way to get them when your client does not show pushed messages. wait_ms waits for the first one (one call waits at most about 50 s). After acting on them, call ack with the last seq.`},
		t.notifications)
	sdk.AddTool(s, &sdk.Tool{Name: "ack", Annotations: &sdk.ToolAnnotations{Title: "Acknowledge notifications", DestructiveHint: hint(false), IdempotentHint: true, OpenWorldHint: hint(false)},
		Description: `Acknowledge a session's notifications up to seq: they are not listed again. Ack what you have acted on, whether it was pushed to you or listed by notifications.`},
		t.ack)
	sdk.AddTool(s, &sdk.Tool{Name: "end_session", Annotations: &sdk.ToolAnnotations{Title: "End a session", DestructiveHint: hint(true), IdempotentHint: true, OpenWorldHint: hint(false)},
		Description: `End a session: every job of it still queued or running stops (aborted, reason session_ended), and none of them notifies. A session is the name that groups jobs and their notifications (this connection's unless run named another); ending it is how an agent cleans up everything it started. A later run in the session opens it again.`},
		t.endSession)
	sdk.AddTool(s, &sdk.Tool{Name: "runners", Annotations: readOnly,
		Description: `List the runners: id, pool, slots and jobs running, whether they can run readonly jobs, last heartbeat.`},
		t.runners)
}

// api calls the API and returns its JSON reply as the result's text.
func (t *tools) api(ctx context.Context, method, path string, body any) (*sdk.CallToolResult, any, error) {
	raw, err := t.c.Do(ctx, method, path, body)
	if err != nil {
		return nil, nil, err
	}
	return textResult(string(raw)), nil, nil
}

func textResult(s string) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: s}}}
}

func (t *tools) run(ctx context.Context, req *sdk.CallToolRequest, in startInput) (*sdk.CallToolResult, *JobResult, error) {
	if in.BlockUntilMS < 0 {
		return nil, nil, errors.New("block_until_ms must not be negative")
	}
	sr := client.StartRequest{
		Command: in.Command, Cwd: cmp.Or(in.Cwd, t.cfg.Cwd), Title: in.Title, Env: in.Env, Readonly: in.Readonly,
		Shell: in.Shell, User: in.User, Stdin: in.Stdin, TTY: in.TTY, Linger: in.Linger, LingerCgroup: in.LingerCgroup, Pool: in.Pool, Session: in.Session,
		Monitor: in.Monitor, Persistent: in.Persistent, NotificationFormat: in.NotificationFormat,
	}
	if sr.Cwd == "" {
		return nil, nil, errors.New("cwd is required: the absolute directory to run the command in")
	}
	if l := in.Limits; l != nil {
		sr.Limits = &client.Limits{MemoryBytes: l.MemoryBytes, CPUMillicores: l.CPUMillicores, Pids: l.Pids, OutputBytes: l.OutputBytes, TimeoutMS: l.TimeoutMS}
	}
	if n := in.NotifyOnOutput; n != nil {
		sr.NotifyOnOutput = &client.NotifyOnOutput{Pattern: n.Pattern, Reason: n.Reason, DebounceMS: n.DebounceMS}
	}
	asked := time.Duration(in.BlockUntilMS) * time.Millisecond
	sr.BlockUntil = min(asked, t.cfg.MaxBlock)
	start := time.Now()
	stop := t.progress(ctx, req, sr.BlockUntil, "waiting for the command to end")
	sr.IdempotencyKey = client.NewIdempotencyKey() // the client may then send it again on a failed connection
	reply, err := t.c.Start(ctx, sr)
	stop()
	if err != nil {
		return nil, nil, err
	}
	res, err := t.jobResult(ctx, &reply.Job, 0)
	if err != nil {
		return nil, nil, err
	}
	// The start reply counted the lines of the same cut: its note tells the model how much it sees.
	if reply.OutputTruncated && res.OutputEnd == reply.OutputBytes && res.Output == reply.Output {
		res.note = reply.TruncationNote()
	}
	var note string
	switch {
	case res.Done:
	case asked > time.Since(start):
		res.Next = t.waitNext(res, asked-time.Since(start), "", "")
		note = t.stillRunning(res)
	case asked > 0:
		note = fmt.Sprintf("Still %s after the %s asked; it goes on in the background.\n%s", reply.Job.Status, asked, backgroundHelp(res))
	default:
		note = "Started in the background.\n" + backgroundHelp(res)
	}
	return textResult(res.text(note)), res, nil
}

func (t *tools) wait(ctx context.Context, req *sdk.CallToolRequest, in waitInput) (*sdk.CallToolResult, *JobResult, error) {
	asked := defaultWait
	if in.TimeoutMS != nil {
		if *in.TimeoutMS < 0 {
			return nil, nil, errors.New("timeout_ms must not be negative")
		}
		asked = min(time.Duration(*in.TimeoutMS)*time.Millisecond, client.MaxWait)
	}
	if in.Offset < 0 {
		return nil, nil, errors.New("offset must not be negative")
	}
	budget := min(asked, t.cfg.MaxBlock)
	if in.ID == "" {
		return t.sleep(ctx, req, in, asked, budget)
	}
	start := time.Now()
	stop := t.progress(ctx, req, budget, "waiting for job "+in.ID)
	w, err := t.c.WaitPort(ctx, in.ID, budget, in.Pattern, in.Port)
	stop()
	if err != nil {
		return nil, nil, err
	}
	res, err := t.jobResult(ctx, &w.Job, in.Offset)
	if err != nil {
		return nil, nil, err
	}
	res.Done, res.PatternMatched, res.Matched, res.MatchedOffset, res.Port = w.Done, w.PatternMatched, w.Matched, w.MatchedOffset, w.Port
	var note string
	switch {
	case w.Done:
	case w.PatternMatched:
		note = fmt.Sprintf("The pattern %q matched", in.Pattern)
		if w.Matched != nil && w.MatchedOffset != nil {
			note += fmt.Sprintf(" %q at byte %d", *w.Matched, *w.MatchedOffset)
		}
		note += fmt.Sprintf("; the job is still %s.", w.Job.Status)
	case w.Port != nil:
		note = fmt.Sprintf("The job listens on %s; it is still %s.", net.JoinHostPort(w.Port.Address, strconv.Itoa(w.Port.Port)), w.Job.Status)
	case asked > time.Since(start):
		res.Next = t.waitNext(res, asked-time.Since(start), in.Pattern, in.Port)
		note = t.stillRunning(res)
	default:
		note = fmt.Sprintf("Still %s after %s.", w.Job.Status, asked)
		if in.Pattern != "" {
			note = fmt.Sprintf("The pattern %q has not matched; the job is still %s after %s.", in.Pattern, w.Job.Status, asked)
		}
	}
	return textResult(res.text(note)), res, nil
}

// sleep is wait without a job: AwaitShell's sleep, bounded as every blocking call.
func (t *tools) sleep(ctx context.Context, req *sdk.CallToolRequest, in waitInput, asked, budget time.Duration) (*sdk.CallToolResult, *JobResult, error) {
	if in.Pattern != "" || in.Offset != 0 {
		return nil, nil, errors.New("pattern and offset need a job id")
	}
	start := time.Now()
	stop := t.progress(ctx, req, budget, "sleeping")
	slept, err := t.c.Sleep(ctx, budget)
	stop()
	if err != nil {
		return nil, nil, err
	}
	res := &JobResult{SleptMS: slept.Milliseconds()}
	msg := fmt.Sprintf("Slept %s.", slept)
	if left := asked - time.Since(start); left > 0 {
		res.Next = &Continuation{Tool: "wait", Arguments: map[string]any{"timeout_ms": left.Milliseconds()}}
		msg = fmt.Sprintf("Slept %s of the %s asked (one call waits at most %s). To sleep on, call wait with %s.",
			slept, asked, t.cfg.MaxBlock, jsonText(res.Next.Arguments))
	}
	return textResult(msg), res, nil
}

// waitNext is the wait call that goes on waiting for left more.
func (t *tools) waitNext(res *JobResult, left time.Duration, pattern, port string) *Continuation {
	args := map[string]any{"id": res.Job.ID, "timeout_ms": max(left, time.Millisecond).Milliseconds(), "offset": res.OutputEnd}
	if pattern != "" {
		args["pattern"] = pattern
	}
	if port != "" {
		args["port"] = port
	}
	return &Continuation{Tool: "wait", Arguments: args}
}

func (t *tools) stillRunning(res *JobResult) string {
	return fmt.Sprintf("Still %s: this call returned after %s, the most one call waits, so that your client does not time out. To go on waiting, call %s with %s.",
		res.Job.Status, t.cfg.MaxBlock, res.Next.Tool, jsonText(res.Next.Arguments))
}

func backgroundHelp(res *JobResult) string {
	return fmt.Sprintf(`A notification comes when it ends. To wait for it, or for a line of output, call wait with {"id":%q} (add "pattern"); to read new output, call output with {"id":%q,"offset":%d}; to stop it, kill.`,
		res.Job.ID, res.Job.ID, res.OutputEnd)
}

func (t *tools) output(ctx context.Context, _ *sdk.CallToolRequest, in outputInput) (*sdk.CallToolResult, *OutputResult, error) {
	if in.Offset < 0 || in.Limit < 0 {
		return nil, nil, errors.New("offset and limit must not be negative")
	}
	limit := in.Limit
	if limit == 0 {
		limit = InlineOutput
	}
	limit = min(limit, maxOutputLimit)
	out, total, err := t.c.Output(ctx, in.ID, in.Offset, limit)
	if err != nil {
		return nil, nil, err
	}
	res := &OutputResult{Output: string(out), Offset: in.Offset, End: in.Offset + int64(len(out)), Total: total}
	msg := res.Output
	if msg != "" && msg[len(msg)-1] != '\n' {
		msg += "\n"
	}
	msg += fmt.Sprintf("[bytes %d-%d of %d", res.Offset, res.End, total)
	if res.End < total {
		msg += fmt.Sprintf("; %d more: call output with {\"id\":%q,\"offset\":%d}", total-res.End, in.ID, res.End)
	}
	return textResult(msg + "]"), res, nil
}

func (t *tools) send(ctx context.Context, _ *sdk.CallToolRequest, in sendInput) (*sdk.CallToolResult, any, error) {
	if in.Text == "" && !in.Close {
		return nil, nil, errors.New("give text to write, or close: true")
	}
	if err := t.c.Input(ctx, in.ID, in.Text, in.Close); err != nil {
		return nil, nil, err
	}
	msg := fmt.Sprintf("Wrote %d bytes to the input of job %s", len(in.Text), in.ID)
	if in.Close {
		msg += ", then closed it"
	}
	return textResult(msg + `. To see what it printed, call wait with {"id":` + jsonText(in.ID) + `,"timeout_ms":2000} and the offset of your last result.`), nil, nil
}

func (t *tools) status(ctx context.Context, _ *sdk.CallToolRequest, in jobInput) (*sdk.CallToolResult, any, error) {
	return t.api(ctx, "GET", api.JobPath(in.ID), nil)
}

func (t *tools) list(ctx context.Context, _ *sdk.CallToolRequest, in listInput) (*sdk.CallToolResult, any, error) {
	// Fewer than the API's 100 by default: a listing goes into a model's context.
	limit := cmp.Or(in.Limit, listLimit)
	return t.api(ctx, "GET", client.JobsPath(client.JobsQuery{Session: in.Session, Status: in.Status, Limit: limit}), nil)
}

func (t *tools) kill(ctx context.Context, _ *sdk.CallToolRequest, in killInput) (*sdk.CallToolResult, any, error) {
	var body any
	if in.Signal != "" {
		body = map[string]string{"signal": in.Signal}
	}
	return t.api(ctx, "POST", api.JobKillPath(in.ID), body)
}

func (t *tools) notifications(ctx context.Context, req *sdk.CallToolRequest, in notificationsInput) (*sdk.CallToolResult, *client.Notifications, error) {
	if in.WaitMS < 0 {
		return nil, nil, errors.New("wait_ms must not be negative")
	}
	asked := time.Duration(in.WaitMS) * time.Millisecond
	budget := min(asked, t.cfg.MaxBlock)
	start := time.Now()
	stop := t.progress(ctx, req, budget, "waiting for a notification")
	page, err := t.c.QueryNotifications(ctx, client.NotificationsQuery{Session: in.Session, After: in.After, Wait: budget, Format: cmp.Or(in.Format, t.cfg.Format)})
	stop()
	if err != nil {
		return nil, nil, err
	}
	if page.Notifications == nil {
		page.Notifications = []client.Notification{}
	}
	var msg string
	for _, n := range page.Notifications {
		msg += n.Text + "\n\n"
	}
	switch n := len(page.Notifications); {
	case n > 0:
		msg += fmt.Sprintf("%d notification(s), seq %d to %d. After acting on them, call ack with {\"seq\":%d}.",
			n, page.Notifications[0].Seq, page.Next, page.Next)
	case asked > time.Since(start):
		args := map[string]any{"wait_ms": (asked - time.Since(start)).Milliseconds(), "after": page.Next}
		if in.Session != "" {
			args["session"] = in.Session
		}
		if in.Format != "" {
			args["format"] = in.Format
		}
		msg = fmt.Sprintf("No notification yet after %s, the most one call waits. To go on waiting, call notifications with %s.", t.cfg.MaxBlock, jsonText(args))
	default:
		msg = "No notification."
	}
	return textResult(msg), page, nil
}

func (t *tools) ack(ctx context.Context, _ *sdk.CallToolRequest, in ackInput) (*sdk.CallToolResult, any, error) {
	s, err := t.c.Ack(ctx, in.Session, in.Seq)
	if err != nil {
		return nil, nil, err
	}
	return textResult(fmt.Sprintf("Acked up to seq %d of session %s (last seq %d).", s.Acked, s.ID, s.LastSeq)), nil, nil
}

func (t *tools) endSession(ctx context.Context, _ *sdk.CallToolRequest, in sessionInput) (*sdk.CallToolResult, any, error) {
	return t.api(ctx, "DELETE", api.SessionPath(in.Session), nil)
}

func (t *tools) runners(ctx context.Context, _ *sdk.CallToolRequest, _ noInput) (*sdk.CallToolResult, any, error) {
	return t.api(ctx, "GET", api.RouteRunners, nil)
}
