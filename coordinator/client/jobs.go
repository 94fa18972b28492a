package client

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/sbx-dev/sbx/coordinator/api"
)

// Start starts a job (POST /v1/jobs).
func (c *Client) Start(ctx context.Context, req StartRequest) (*StartReply, error) {
	raw, err := c.StartRaw(ctx, req)
	if err != nil {
		return nil, err
	}
	var r StartReply
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("POST /v1/jobs: decode reply: %w", err)
	}
	return &r, nil
}

// startAttempts is how many times a start with an idempotency key is sent when its connection
// fails: a reset after the server took the request, a coordinator restarting.
const startAttempts = 3

// StartRaw is Start returning the API's JSON, for callers that print it (--json). A request with
// an IdempotencyKey whose connection fails (reset, closed before the reply) is sent again, up to
// startAttempts times in all: the server answers a repeat with the job the first one started.
// Without a key it is sent once, since a repeat could start the command twice.
func (c *Client) StartRaw(ctx context.Context, req StartRequest) ([]byte, error) {
	var hdr http.Header
	attempts := 1
	if req.IdempotencyKey != "" {
		hdr = http.Header{api.HeaderIdempotencyKey: {req.IdempotencyKey}}
		attempts = startAttempts
	}
	var err error
	for range attempts {
		var raw []byte
		raw, err = c.doHeader(ctx, "POST", api.RouteJobs, req, hdr)
		var apiErr *Error
		if err == nil || errors.As(err, &apiErr) || ctx.Err() != nil {
			return raw, err
		}
	}
	return nil, err
}

// NewIdempotencyKey returns a random key for StartRequest.IdempotencyKey.
func NewIdempotencyKey() string { return rand.Text() }

// Job returns a job (GET /v1/jobs/{id}).
func (c *Client) Job(ctx context.Context, id string) (*Job, error) {
	var j Job
	if err := c.call(ctx, "GET", api.JobPath(id), nil, &j); err != nil {
		return nil, err
	}
	return &j, nil
}

// JobsPath is the path of a listing, for Do: q.Path().
func JobsPath(q JobsQuery) string { return q.Path() }

// Jobs lists jobs, newest first (GET /v1/jobs).
func (c *Client) Jobs(ctx context.Context, q JobsQuery) ([]Job, error) {
	var r api.JobsReply
	if err := c.call(ctx, "GET", q.Path(), nil, &r); err != nil {
		return nil, err
	}
	return r.Jobs, nil
}

// WaitPath is the path of a wait, for Do; see Wait.
func WaitPath(id string, timeout time.Duration, pattern string) string {
	return WaitPortPath(id, timeout, pattern, "")
}

// WaitPortPath is the path of a wait that also returns once the job listens on port (a number, or
// "any"; "": no port), for Do; see WaitPort.
func WaitPortPath(id string, timeout time.Duration, pattern, port string) string {
	return api.JobWaitPath(id, timeout, pattern, port)
}

// MaxWait is the longest single wait the API accepts; longer waits are made of several.
const MaxWait = 7140 * time.Second

// Wait returns when the job ends, when pattern (RE2; ^ and $ match at lines) matches its output,
// or after timeout (GET /v1/jobs/{id}/wait). A timeout of 0 answers at once; a negative one means
// the server's default, 30 s. ctx must outlast the timeout.
func (c *Client) Wait(ctx context.Context, id string, timeout time.Duration, pattern string) (*WaitReply, error) {
	var r WaitReply
	if err := c.call(ctx, "GET", WaitPath(id, timeout, pattern), nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// WaitPort is Wait that also returns once the job listens on a TCP port: port is a number, or
// "any" (GET /v1/jobs/{id}/wait?port=). The reply's Port says which.
func (c *Client) WaitPort(ctx context.Context, id string, timeout time.Duration, pattern, port string) (*WaitReply, error) {
	var r WaitReply
	if err := c.call(ctx, "GET", WaitPortPath(id, timeout, pattern, port), nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Resize sets the size of a tty job's terminal and returns the job (POST /v1/jobs/{id}/resize).
func (c *Client) Resize(ctx context.Context, id string, size TTYSize) (*Job, error) {
	var r api.JobReply
	body := api.ResizeRequest{Rows: &size.Rows, Cols: &size.Cols}
	if err := c.call(ctx, "POST", api.JobResizePath(id), body, &r); err != nil {
		return nil, err
	}
	return &r.Job, nil
}

// Input writes data to the standard input of a job started with Stdin, then closes it (EOF) when
// closeIt is set (POST /v1/jobs/{id}/stdin).
func (c *Client) Input(ctx context.Context, id, data string, closeIt bool) error {
	_, err := c.Do(ctx, "POST", api.JobStdinPath(id), api.StdinRequest{Data: data, Close: closeIt})
	return err
}

// Sleep waits timeout on the server (GET /v1/wait): AwaitShell without a job. It returns how long
// the server slept.
func (c *Client) Sleep(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	var r api.SleepReply
	if err := c.call(ctx, "GET", api.SleepPath(timeout), nil, &r); err != nil {
		return 0, err
	}
	return time.Duration(r.SleptMS) * time.Millisecond, nil
}

// Output returns at most limit bytes of the job's output from offset (limit < 0: all there is
// now) and the output's total size now (GET /v1/jobs/{id}/output).
func (c *Client) Output(ctx context.Context, id string, offset, limit int64) ([]byte, int64, error) {
	resp, err := c.send(ctx, "GET", api.JobOutputPath(id, offset, limit), nil)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	total, err := strconv.ParseInt(resp.Header.Get(api.HeaderOutputLength), 10, 64)
	if err != nil {
		return nil, 0, fmt.Errorf("output of %s: bad %s %q", id, api.HeaderOutputLength, resp.Header.Get(api.HeaderOutputLength))
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, 0, fmt.Errorf("output of %s: %w", id, err)
	}
	return data, total, nil
}

// Follow writes the job's output from offset to w as it comes, until the job ends (nil) or ctx
// ends (ctx's error). A stream the server cut short (it shut down) is an error, not an end: the
// server ends a stream cleanly only after the job's last byte.
func (c *Client) Follow(ctx context.Context, id string, offset int64, w io.Writer) error {
	resp, err := c.send(ctx, "GET", api.JobFollowPath(id, offset), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("follow output of %s: the server ended the stream before the job ended", id)
		}
		return fmt.Errorf("follow output of %s: %w", id, err)
	}
	return nil
}

// Kill stops a job and returns it (POST /v1/jobs/{id}/kill). signal "" means TERM, then KILL
// after 2 s. Killing an ended job is an *Error with code "conflict".
func (c *Client) Kill(ctx context.Context, id, signal string) (*Job, error) {
	var body any
	if signal != "" {
		body = api.KillRequest{Signal: signal}
	}
	var r api.JobReply
	if err := c.call(ctx, "POST", api.JobKillPath(id), body, &r); err != nil {
		return nil, err
	}
	return &r.Job, nil
}

// Runners lists the runners the coordinator hears from (GET /v1/runners).
func (c *Client) Runners(ctx context.Context) ([]Runner, error) {
	var r []Runner
	if err := c.call(ctx, "GET", api.RouteRunners, nil, &r); err != nil {
		return nil, err
	}
	return r, nil
}
