package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sbx-dev/sbx/coordinator/client"
)

// clientCmd is what every client command shares: the client and the --json flag.
type clientCmd struct {
	c      *client.Client
	json   bool
	stdout io.Writer
	stderr io.Writer
	addr   string
}

func cmdClient(ctx context.Context, name string, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	c, err := client.FromEnv(getenv)
	if err != nil {
		return err
	}
	cc := &clientCmd{c: c, stdout: stdout, stderr: stderr, addr: cmp.Or(getenv("SBX_ADDR"), client.DefaultAddr)}
	fs := newFlags(name, stderr)
	fs.BoolVar(&cc.json, "json", false, "print the API's JSON")
	switch name {
	case "run":
		err = cc.run(ctx, fs, args)
	case "ps":
		err = cc.ps(ctx, fs, args)
	case "status":
		err = cc.status(ctx, fs, args)
	case "wait":
		err = cc.wait(ctx, fs, args)
	case "logs":
		err = cc.logs(ctx, fs, args)
	case "kill":
		err = cc.kill(ctx, fs, args)
	case "runners":
		err = cc.runners(ctx, fs, args)
	case "events":
		err = cc.events(ctx, fs, args)
	case "send":
		err = cc.send(ctx, fs, args)
	case "end-session":
		err = cc.endSession(ctx, fs, args)
	}
	return cc.explain(err)
}

// explain turns transport and API errors into one clear line.
func (cc *clientCmd) explain(err error) error {
	var apiErr *client.Error
	var netErr *net.OpError
	var certErr *tls.CertificateVerificationError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &apiErr):
		return &exitError{code: 1, msg: apiErr.Message + " (" + apiErr.Code + ")"}
	case errors.As(err, &certErr):
		return &exitError{code: 1, msg: fmt.Sprintf("the coordinator at %s has a certificate this client does not trust (set SBX_CA_FILE to its CA's PEM file): %v", cc.addr, certErr.Err)}
	case errors.As(err, &netErr):
		return &exitError{code: 1, msg: fmt.Sprintf("cannot reach the coordinator at %s (is `sbx serve` running? set SBX_ADDR): %v", cc.addr, netErr.Err)}
	}
	return err
}

// oneID parses flags and exactly one job id.
func oneID(fs *flag.FlagSet, args []string) (string, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return "", err
	}
	if len(pos) != 1 {
		return "", usageError("%s: want exactly one job id, got %d arguments", fs.Name(), len(pos))
	}
	return pos[0], nil
}

func (cc *clientCmd) printJSON(data []byte) error {
	_, err := fmt.Fprintln(cc.stdout, strings.TrimSpace(string(data)))
	return err
}

// exitWith is the exit status of a command that reports an ended job: the job's exit code.
func exitWith(j *client.Job) error {
	if j.ExitCode == nil {
		return &exitError{code: 1, msg: fmt.Sprintf("job %s %s (%s) %s", j.ID, j.Status, j.Reason, j.Error)}
	}
	if *j.ExitCode == 0 {
		return nil
	}
	return &exitError{code: *j.ExitCode}
}

// envList collects repeated --env K=V flags.
type envList map[string]string

func (e envList) String() string { return "" }

func (e envList) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want K=V, got %q", v)
	}
	e[k] = val
	return nil
}

func (cc *clientCmd) run(ctx context.Context, fs *flag.FlagSet, args []string) error {
	req := client.StartRequest{Env: envList{}}
	var limits client.Limits
	var wait, timeout time.Duration
	var memory string
	var cpus float64
	fs.BoolVar(&req.Readonly, "readonly", false, "run in the read-only sandbox")
	fs.StringVar(&req.Cwd, "cwd", "", "directory to run in (default: the current one)")
	fs.StringVar(&req.Title, "title", "", "title (default: the command's first line)")
	fs.DurationVar(&wait, "wait", 0, "wait this long for the job to end; print its output and exit with its code")
	fs.DurationVar(&timeout, "timeout", 0, "stop the job after this long")
	fs.StringVar(&memory, "memory", "", "memory limit, e.g. 512M")
	fs.Int64Var(&limits.Pids, "pids", 0, "limit on processes")
	fs.Float64Var(&cpus, "cpus", 0, "CPU limit in CPUs, e.g. 1.5")
	fs.StringVar(&req.Session, "session", "", "session of the job")
	fs.StringVar(&req.Pool, "pool", "", "pool of runners")
	fs.BoolVar(&req.Stdin, "stdin", false, "give the job an input pipe (sbx send writes to it) instead of /dev/null")
	fs.BoolVar(&req.TTY, "tty", false, "run the job on a pseudo-terminal (24x80; sbx send types on it)")
	fs.BoolVar(&req.Linger, "linger", false, "keep the job until its output closes (background children printing), not only until its shell exits")
	fs.BoolVar(&req.LingerCgroup, "linger-cgroup", false, "keep the job until every process it started has exited, daemons with their output redirected too (nohup setsid srv >/dev/null 2>&1 &)")
	fs.StringVar(&req.Shell, "shell", "", "sh or bash (default: the runner's, bash where installed)")
	fs.StringVar(&req.User, "user", "", "user the job runs as (default: the runner's; the runner must allow it)")
	fs.Var(envList(req.Env), "env", "K=V added to the job's environment (repeatable)")
	notifyOn := fs.String("notify-on", "", "notify when an output line matches this RE2 pattern")
	fs.BoolVar(&req.Monitor, "monitor", false, "notify every output line (stopped if it prints too fast)")
	fs.BoolVar(&req.Persistent, "persistent", false, "with --monitor: no default timeout")
	ws := fs.String("ws", "", "instead of a command, a ws:// or wss:// URL whose messages are the output (read by the runner)")
	fs.StringVar(&req.ToolCallID, "tool-call-id", "", "the agent's tool call that starts the job: its notifications name it (tool_call_id, <tool_use_id>)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *notifyOn != "" {
		req.NotifyOnOutput = &client.NotifyOnOutput{Pattern: *notifyOn, Reason: *notifyOn}
	}
	command := fs.Args()
	switch {
	case *ws != "" && len(command) > 0:
		return usageError("run: give a command or --ws URL, not both")
	case *ws != "":
		req.Source = &client.Source{WS: *ws}
	case len(command) == 0:
		return usageError("run: give the command after --, e.g. sbx run -- make test")
	}
	req.Command = strings.Join(command, " ")
	if req.Cwd == "" {
		wd, err := os.Getwd()
		if err != nil {
			return fmt.Errorf("current directory: %w", err)
		}
		req.Cwd = wd
	}
	if memory != "" {
		n, err := parseBytes(memory)
		if err != nil {
			return usageError("--memory: %v", err)
		}
		limits.MemoryBytes = n
	}
	limits.CPUMillicores = int64(cpus * 1000)
	limits.TimeoutMS = timeout.Milliseconds()
	if limits != (client.Limits{}) {
		req.Limits = &limits
	}
	req.BlockUntil = wait
	if wait < 0 || timeout < 0 || cpus < 0 {
		return usageError("run: --wait, --timeout and --cpus must not be negative")
	}
	reply, raw, err := cc.start(ctx, req)
	if err != nil {
		return err
	}
	if cc.json {
		return cc.printJSON(raw)
	}
	if wait == 0 {
		fmt.Fprintln(cc.stdout, reply.Job.ID)
		if r := reply.Job.QueuedReason; r != nil {
			fmt.Fprintln(cc.stderr, "sbx: queued: "+*r)
		}
		return nil
	}
	if reply.Backgrounded {
		// stdout keeps the job's bytes; the note says they are its end only.
		if note := reply.TruncationNote(); note != "" {
			fmt.Fprintln(cc.stderr, note)
		}
		fmt.Fprint(cc.stdout, reply.Output)
		return &exitError{code: 0, msg: fmt.Sprintf("job %s still running after %s; follow it with: sbx logs -f %s", reply.Job.ID, wait, reply.Job.ID)}
	}
	// The reply's output is a JSON string; print the exact bytes from the output endpoint.
	out, _, err := cc.c.Output(ctx, reply.Job.ID, 0, -1)
	if err != nil {
		return err
	}
	if _, err := cc.stdout.Write(out); err != nil {
		return err
	}
	return exitWith(&reply.Job)
}

// start starts a job, once however often the request is sent, and returns both the decoded reply
// and its JSON.
func (cc *clientCmd) start(ctx context.Context, req client.StartRequest) (*client.StartReply, []byte, error) {
	// A key of its own, so that the client may send the start again when the connection fails.
	req.IdempotencyKey = client.NewIdempotencyKey()
	raw, err := cc.c.StartRaw(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	var reply client.StartReply
	if err := json.Unmarshal(raw, &reply); err != nil {
		return nil, nil, fmt.Errorf("decode reply: %w", err)
	}
	return &reply, raw, nil
}

func (cc *clientCmd) ps(ctx context.Context, fs *flag.FlagSet, args []string) error {
	var q client.JobsQuery
	fs.StringVar(&q.Session, "session", "", "only this session's jobs")
	fs.StringVar(&q.Status, "status", "", "only jobs with this status")
	fs.IntVar(&q.Limit, "limit", 0, "at most this many jobs (default 100)")
	if pos, err := parseArgs(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return usageError("ps takes no arguments")
	}
	if cc.json {
		raw, err := cc.c.Do(ctx, "GET", client.JobsPath(q), nil)
		if err != nil {
			return err
		}
		return cc.printJSON(raw)
	}
	jobs, err := cc.c.Jobs(ctx, q)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(cc.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tEXIT\tELAPSED\tTITLE")
	for _, j := range jobs {
		exit := "-"
		if j.ExitCode != nil {
			exit = strconv.Itoa(*j.ExitCode)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", j.ID, j.Status, exit, time.Duration(j.ElapsedMS)*time.Millisecond, j.Title)
	}
	return tw.Flush()
}

func (cc *clientCmd) status(ctx context.Context, fs *flag.FlagSet, args []string) error {
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	raw, err := cc.c.Do(ctx, "GET", client.JobPath(id, ""), nil)
	if err != nil {
		return err
	}
	if cc.json {
		return cc.printJSON(raw)
	}
	var j client.Job
	if err := json.Unmarshal(raw, &j); err != nil {
		return fmt.Errorf("decode job: %w", err)
	}
	exit := "-"
	if j.ExitCode != nil {
		exit = strconv.Itoa(*j.ExitCode)
	}
	fmt.Fprintf(cc.stdout, "id: %s\nstatus: %s\nreason: %s\nexit_code: %s\ntitle: %s\ncommand: %s\ncwd: %s\nrunner: %s\nelapsed_ms: %d\noutput_bytes: %d\noutput_path: %s\n",
		j.ID, j.Status, j.Reason, exit, j.Title, j.Command, j.Cwd, j.Runner, j.ElapsedMS, j.OutputBytes, j.OutputPath)
	if j.Error != "" {
		fmt.Fprintf(cc.stdout, "error: %s\n", j.Error)
	}
	if j.TTYSize != nil {
		fmt.Fprintf(cc.stdout, "tty: %dx%d\n", j.TTYSize.Rows, j.TTYSize.Cols)
	}
	for _, p := range j.Ports {
		fmt.Fprintf(cc.stdout, "listening: %s\n", net.JoinHostPort(p.Address, strconv.Itoa(p.Port)))
	}
	return nil
}

func (cc *clientCmd) wait(ctx context.Context, fs *flag.FlagSet, args []string) error {
	pattern := fs.String("pattern", "", "return when this RE2 pattern matches the output so far")
	port := fs.String("port", "", "return when the job listens on this TCP port (or any); prints the address")
	timeout := fs.Duration("timeout", 0, "give up after this long (default: wait for the end); without a job id, sleep this long")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if *timeout < 0 {
		return usageError("wait: --timeout must not be negative")
	}
	if *port != "" && *port != "any" {
		if n, err := strconv.Atoi(*port); err != nil || n < 1 || n > 65535 {
			return usageError("wait: --port %q must be a TCP port (1-65535) or any", *port)
		}
	}
	if len(pos) == 0 && *timeout > 0 && *pattern == "" && *port == "" {
		_, err := cc.c.Sleep(ctx, *timeout)
		return err
	}
	if len(pos) != 1 {
		return usageError("wait: want one job id (or none, with --timeout, to sleep), got %d arguments", len(pos))
	}
	id := pos[0]
	var deadline time.Time
	if *timeout > 0 {
		deadline = time.Now().Add(*timeout)
	}
	for {
		step := client.MaxWait
		if !deadline.IsZero() {
			step = min(step, max(0, time.Until(deadline)))
		}
		path := client.WaitPortPath(id, step, *pattern, *port)
		raw, err := cc.c.Do(ctx, "GET", path, nil)
		if err != nil {
			return err
		}
		var w client.WaitReply
		if err := json.Unmarshal(raw, &w); err != nil {
			return fmt.Errorf("decode wait: %w", err)
		}
		finished := w.Done || w.PatternMatched || w.Port != nil || (!deadline.IsZero() && !time.Now().Before(deadline))
		if !finished {
			continue
		}
		if cc.json {
			if err := cc.printJSON(raw); err != nil {
				return err
			}
		}
		switch {
		case w.PatternMatched:
			if !cc.json && w.Matched != nil {
				fmt.Fprintln(cc.stdout, *w.Matched)
			}
			return nil
		case w.Port != nil:
			if !cc.json {
				fmt.Fprintln(cc.stdout, net.JoinHostPort(w.Port.Address, strconv.Itoa(w.Port.Port)))
			}
			return nil
		case w.Done:
			return exitWith(&w.Job)
		default:
			return &exitError{code: 1, msg: fmt.Sprintf("job %s is still %s after %s", id, w.Job.Status, *timeout)}
		}
	}
}

func (cc *clientCmd) logs(ctx context.Context, fs *flag.FlagSet, args []string) error {
	follow := fs.Bool("f", false, "follow the output until the job ends")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	if *follow {
		return cc.c.Follow(ctx, id, 0, cc.stdout)
	}
	out, _, err := cc.c.Output(ctx, id, 0, -1)
	if err != nil {
		return err
	}
	_, err = cc.stdout.Write(out)
	return err
}

// send writes its words, joined by spaces, and a newline to a job's input: what a person types at a
// prompt. --no-newline leaves the newline out, --close closes the input afterwards (EOF).
func (cc *clientCmd) send(ctx context.Context, fs *flag.FlagSet, args []string) error {
	noNewline := fs.Bool("no-newline", false, "do not end the text with a newline")
	closeIt := fs.Bool("close", false, "close the job's input after the text (EOF)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageError("send: want a job id and the text, e.g. sbx send ID y")
	}
	id, text := pos[0], strings.Join(pos[1:], " ")
	if len(pos) > 1 && !*noNewline {
		text += "\n"
	}
	if text == "" && !*closeIt {
		return usageError("send: give the text to send, or --close")
	}
	return cc.c.Input(ctx, id, text, *closeIt)
}

func (cc *clientCmd) kill(ctx context.Context, fs *flag.FlagSet, args []string) error {
	signal := fs.String("signal", "", "signal to send (default TERM, then KILL after 2 s)")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	var body any
	if *signal != "" {
		body = map[string]string{"signal": *signal}
	}
	raw, err := cc.c.Do(ctx, "POST", client.JobPath(id, "/kill"), body)
	if err != nil {
		return err
	}
	if cc.json {
		return cc.printJSON(raw)
	}
	fmt.Fprintln(cc.stdout, id)
	return nil
}

func (cc *clientCmd) runners(ctx context.Context, fs *flag.FlagSet, args []string) error {
	if pos, err := parseArgs(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return usageError("runners takes no arguments")
	}
	raw, err := cc.c.Do(ctx, "GET", "/v1/runners", nil)
	if err != nil {
		return err
	}
	if cc.json {
		return cc.printJSON(raw)
	}
	var rs []client.Runner
	if err := json.Unmarshal(raw, &rs); err != nil {
		return fmt.Errorf("decode runners: %w", err)
	}
	tw := tabwriter.NewWriter(cc.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPOOL\tSTATE\tRUNNING\tSLOTS\tREADONLY\tCGROUP\tLAST SEEN\tLABELS")
	for _, r := range rs {
		state := "ready"
		if r.Draining {
			state = "draining"
		}
		labels := make([]string, 0, len(r.Labels))
		for k, v := range r.Labels {
			labels = append(labels, k+"="+v)
		}
		slices.Sort(labels)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%v\t%s\t%s ago\t%s\n", r.ID, r.Pool, state, r.Running, r.Slots, r.Readonly, r.Cgroup,
			time.Since(r.LastSeen).Round(time.Second), strings.Join(labels, ","))
	}
	return tw.Flush()
}

// maxEventWait is the longest long-poll `sbx events -f` makes; it polls again after each.
const maxEventWait = 5 * time.Minute

// events prints the session's notifications after its acked cursor, acking each as it is printed;
// with -f it follows, long-polling, until interrupted.
func (cc *clientCmd) events(ctx context.Context, fs *flag.FlagSet, args []string) error {
	follow := fs.Bool("f", false, "follow: wait for notifications and print them as they come")
	session := fs.String("session", "", "session (default: default)")
	format := fs.String("format", "", "write each text as system_notification or task_notification (default: as stored)")
	if pos, err := parseArgs(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return usageError("events takes no arguments")
	}
	id := *session
	if id == "" {
		id = "default"
	}
	var after *uint64
	for {
		var wait time.Duration
		if *follow {
			wait = maxEventWait
		}
		raw, err := cc.c.Do(ctx, "GET", client.NotificationsQuery{Session: id, After: after, Wait: wait, Format: *format}.Path(), nil)
		if err != nil {
			if *follow && ctx.Err() != nil {
				return nil // interrupted
			}
			return err
		}
		var page client.Notifications
		if err := json.Unmarshal(raw, &page); err != nil {
			return fmt.Errorf("decode notifications: %w", err)
		}
		if cc.json && !*follow {
			if err := cc.printJSON(raw); err != nil {
				return err
			}
		}
		for _, n := range page.Notifications {
			if cc.json {
				if *follow {
					line, _ := json.Marshal(n)
					fmt.Fprintln(cc.stdout, string(line))
				}
			} else if _, err := fmt.Fprintln(cc.stdout, n.Text); err != nil {
				return err
			}
		}
		if len(page.Notifications) > 0 {
			if _, err := cc.c.Ack(ctx, id, page.Next); err != nil {
				return err
			}
		}
		next := page.Next
		after = &next
		if !*follow {
			return nil
		}
	}
}

// endSession ends a session, stopping its jobs without notifications, and prints their ids.
func (cc *clientCmd) endSession(ctx context.Context, fs *flag.FlagSet, args []string) error {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError("end-session: want exactly one session id, got %d arguments", len(pos))
	}
	raw, err := cc.c.Do(ctx, "DELETE", client.SessionPath(pos[0], ""), nil)
	if err != nil {
		return err
	}
	if cc.json {
		return cc.printJSON(raw)
	}
	var r struct {
		Stopped []string `json:"stopped"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("decode reply: %w", err)
	}
	for _, id := range r.Stopped {
		fmt.Fprintln(cc.stdout, id)
	}
	return nil
}
