package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sbx-dev/sbx/coordinator/client"
)

// jobResult returns j with its output from byte from to the end it has now, cut to the last
// InlineOutput bytes, from the first line that starts in them (as the API's start reply cuts).
func (t *tools) jobResult(ctx context.Context, j *client.Job, from int64) (*JobResult, error) {
	res := &JobResult{Job: j, Done: j.Ended()}
	end := j.OutputBytes
	from = min(from, end)
	start := max(from, end-InlineOutput)
	res.OutputOffset, res.OutputEnd = start, start
	if end == start {
		return res, nil
	}
	data, _, err := t.c.Output(ctx, j.ID, start, end-start)
	if err != nil {
		return nil, err
	}
	if start > from {
		// Cut at a character's first byte, so that the text shown is the output's own.
		skip := 0
		for skip < len(data) && skip < utf8.UTFMax && !utf8.RuneStart(data[skip]) {
			skip++
		}
		data, start = data[skip:], start+int64(skip)
		if i := bytes.IndexByte(data[:max(0, len(data)-1)], '\n'); i >= 0 {
			data, start = data[i+1:], start+int64(i+1)
		}
	}
	res.Output, res.OutputOffset, res.OutputEnd = string(data), start, start+int64(len(data))
	return res, nil
}

// text renders a job result for a model: a line on the job, the output between offsets, and the
// note that says what to do next.
func (r *JobResult) text(note string) string {
	var b strings.Builder
	j := r.Job
	fmt.Fprintf(&b, "job %s %q: %s", j.ID, j.Title, j.Status)
	switch {
	case j.Ended():
		if j.Reason != "" && j.Reason != "exit" {
			fmt.Fprintf(&b, ", reason %s", j.Reason)
		}
		if j.ExitCode != nil {
			fmt.Fprintf(&b, ", exit_code %d", *j.ExitCode)
		}
		fmt.Fprintf(&b, ", after %s", time.Duration(j.ElapsedMS)*time.Millisecond)
		if j.Error != "" {
			fmt.Fprintf(&b, " (%s)", j.Error)
		}
	case j.QueuedReason != nil:
		fmt.Fprintf(&b, " (%s)", *j.QueuedReason)
	case j.StartedAt != nil:
		fmt.Fprintf(&b, " for %s", time.Since(*j.StartedAt).Round(time.Second))
		if j.Pid != nil {
			fmt.Fprintf(&b, ", pid %d", *j.Pid)
		}
	}
	b.WriteString("\n")
	switch {
	case r.OutputEnd == 0:
		b.WriteString("no output\n")
	case r.OutputEnd == r.OutputOffset:
		fmt.Fprintf(&b, "no new output (%d bytes in all)\n", r.OutputEnd)
	default:
		fmt.Fprintf(&b, "output bytes %d-%d of %d", r.OutputOffset, r.OutputEnd, j.OutputBytes)
		if r.OutputOffset > 0 {
			fmt.Fprintf(&b, " (the last %d KiB at most; earlier bytes: call output with {\"id\":%q,\"offset\":0}", InlineOutput>>10, j.ID)
			if j.OutputPath != "" {
				fmt.Fprintf(&b, ", or read %s on the coordinator's machine", j.OutputPath)
			}
			b.WriteString(")")
		}
		b.WriteString(":\n")
		if r.note != "" {
			b.WriteString(r.note + "\n")
		}
		b.WriteString(r.Output)
		if !strings.HasSuffix(r.Output, "\n") {
			b.WriteString("\n[no newline at the end]\n")
		}
	}
	if note != "" {
		b.WriteString(note)
		b.WriteString("\n")
	}
	return b.String()
}

// jsonText is v as compact JSON, for the arguments of a call a result suggests.
func jsonText(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(data)
}

// progress sends a progress notification every t.cfg.ProgressEvery until the returned stop is
// called, when the call carries a progress token: a client sees that the call is alive, and one
// that resets its timeout on progress waits on.
func (t *tools) progress(ctx context.Context, req *sdk.CallToolRequest, budget time.Duration, what string) (stop func()) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil || budget <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(t.cfg.ProgressEvery)
		defer tick.Stop()
		start := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				elapsed := time.Since(start)
				// A failed send means the client is gone; the call itself notices.
				_ = req.Session.NotifyProgress(ctx, &sdk.ProgressNotificationParams{
					ProgressToken: token, Progress: elapsed.Seconds(), Total: budget.Seconds(),
					Message: fmt.Sprintf("%s: %s of at most %s", what, elapsed.Round(time.Second), budget),
				})
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
