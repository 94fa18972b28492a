package runner

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/sbx-dev/sbx/proto"
	"github.com/sbx-dev/sbx/sandbox"
)

// handleControl answers kill, signal, stdin and ping requests for this runner's jobs. Input is
// written in the background (a job that does not read would hold every other request up); its
// answer comes when the write is done or has timed out.
func (r *Runner) handleControl(req micro.Request) {
	reply := &proto.ControlReply{V: proto.Version, Code: proto.ReplyOK}
	c, err := proto.DecodeControl(req.Data())
	if err != nil {
		reply.Code, reply.Message = proto.ReplyInvalid, err.Error()
	} else if c.Op != proto.OpPing {
		r.mu.Lock()
		j := r.jobs[c.JobID]
		r.mu.Unlock()
		switch {
		case j == nil:
			reply.Code, reply.Message = proto.ReplyUnknownJob, "no such job on runner "+r.cfg.ID
		case c.Op == proto.OpKill:
			j.stop(proto.ReasonKilled, "killed on request")
		case c.Op == proto.OpResize:
			reply.Code, reply.Message = j.resize(c.Size)
		case c.Op == proto.OpStdin:
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				reply.Code, reply.Message = j.input(c.Data, c.Close)
				r.respond(req, reply)
			}()
			return
		default:
			n, _ := proto.Signal(c.Signal) // Validate checked it
			if err := j.signal(syscall.Signal(n)); err != nil {
				reply.Code, reply.Message = proto.ReplyUnknownJob, err.Error()
			}
		}
	}
	r.respond(req, reply)
}

func (r *Runner) respond(req micro.Request, reply *proto.ControlReply) {
	if err := req.Respond(proto.Encode(reply)); err != nil {
		r.cfg.Logger.Warn("answer control request", "err", err)
	}
}

// inputTimeout bounds one write to a job's input: it is shorter than the coordinator's control
// timeout, so that a job that does not read gets a clear answer rather than a timed-out request.
const inputTimeout = 3 * time.Second

// input writes data to the job's standard input and closes it when asked. It returns the reply's
// code and message.
func (j *job) input(data []byte, closeIt bool) (string, string) {
	j.mu.Lock()
	p := j.proc
	j.mu.Unlock()
	if p == nil {
		return proto.ReplyRefused, "job " + j.id + " has not started yet"
	}
	in := p.Input()
	if in == nil {
		return proto.ReplyRefused, "job " + j.id + " was not started with stdin: true; its input is /dev/null"
	}
	j.inMu.Lock()
	defer j.inMu.Unlock()
	if j.inClosed {
		return proto.ReplyRefused, "the input of job " + j.id + " is closed"
	}
	if len(data) > 0 {
		_ = in.SetWriteDeadline(time.Now().Add(inputTimeout))
		n, err := in.Write(data)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			return proto.ReplyRefused, fmt.Sprintf("job %s did not read its input within %s (%d of %d bytes written)", j.id, inputTimeout, n, len(data))
		case err != nil:
			j.inClosed = true
			return proto.ReplyRefused, fmt.Sprintf("job %s no longer reads its input (%d of %d bytes written)", j.id, n, len(data))
		}
	}
	if closeIt && j.tty {
		// Closing a terminal's master would hang it up (SIGHUP); EOF on a terminal is the EOF
		// character at the start of a line, which the next read returns as 0 bytes. The terminal stays
		// open for more.
		_ = in.SetWriteDeadline(time.Now().Add(inputTimeout))
		if _, err := in.Write([]byte{eofChar}); err != nil {
			return proto.ReplyRefused, fmt.Sprintf("job %s no longer reads its terminal: %v", j.id, err)
		}
		return proto.ReplyOK, ""
	}
	if closeIt {
		j.inClosed = true
		if err := in.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			return proto.ReplyRefused, fmt.Sprintf("close the input of job %s: %v", j.id, err)
		}
	}
	return proto.ReplyOK, ""
}

// eofChar is ^D, the EOF character of a terminal as the runner leaves it (VEOF).
const eofChar = 0x04

// resizer is a process whose terminal can be resized (a *sandbox.Process).
type resizer interface {
	Resize(sandbox.TTYSize) error
}

// resize sets the size of the job's terminal. It returns the reply's code and message.
func (j *job) resize(size *proto.TTYSize) (string, string) {
	j.mu.Lock()
	p := j.proc
	j.mu.Unlock()
	rp, ok := p.(resizer)
	if p == nil || !ok || !j.tty {
		return proto.ReplyRefused, "job " + j.id + " has no terminal (it was not started with tty: true)"
	}
	err := rp.Resize(sandbox.TTYSize{Rows: uint16(size.Rows), Cols: uint16(size.Cols)})
	switch {
	case errors.Is(err, os.ErrClosed):
		return proto.ReplyUnknownJob, "job " + j.id + " has ended"
	case err != nil:
		return proto.ReplyRefused, err.Error()
	}
	return proto.ReplyOK, ""
}
