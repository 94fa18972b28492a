package runner

import (
	"syscall"

	"github.com/nats-io/nats.go/micro"

	"github.com/sbx-dev/sbx/proto"
)

// handleControl answers kill, signal and ping requests for this runner's jobs.
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
		default:
			if err := j.signal(syscall.Signal(proto.Signals[c.Signal])); err != nil {
				reply.Code, reply.Message = proto.ReplyUnknownJob, err.Error()
			}
		}
	}
	if err := req.Respond(proto.Encode(reply)); err != nil {
		r.cfg.Logger.Warn("answer control request", "err", err)
	}
}
