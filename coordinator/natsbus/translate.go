package natsbus

import (
	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/proto"
)

// The one place the coordinator's types and the wire's meet: the domain speaks its own types
// (coordinator.Work, Event, ...), the runners proto's, and these functions copy each field across.
// translate_test.go fails for a field one side has and the other does not carry.

// wireWork is the Work message of a job to dispatch, at this wire's version. Its NotAfter is
// stamped by Dispatch.
func wireWork(w *coordinator.Work) *proto.Work {
	return &proto.Work{
		V: proto.Version, JobID: w.JobID, Command: w.Command, Cwd: w.Cwd, Env: w.Env,
		Readonly: w.Readonly, Pool: w.Pool, Limits: wireLimits(w.Limits), User: w.User, Shell: w.Shell,
		Linger: w.Linger, LingerCgroup: w.LingerCgroup, Stdin: w.Stdin, Claim: w.Claim,
		SeparateStderr: w.SeparateStderr, Source: wireSource(w.Source), TTY: w.TTY, TTYSize: wireTTYSize(w.TTYSize),
	}
}

func wireLimits(l coordinator.Limits) proto.Limits {
	return proto.Limits{MemoryBytes: l.MemoryBytes, CPUMillicores: l.CPUMillicores, Pids: l.Pids, OutputBytes: l.OutputBytes, TimeoutMS: l.TimeoutMS}
}

func wireSource(s *coordinator.Source) *proto.Source {
	if s == nil {
		return nil
	}
	return &proto.Source{WS: s.WS}
}

func wireTTYSize(s *coordinator.TTYSize) *proto.TTYSize {
	if s == nil {
		return nil
	}
	return &proto.TTYSize{Rows: s.Rows, Cols: s.Cols}
}

// wireControl is the Control request, at this wire's version.
func wireControl(c *coordinator.Control) *proto.Control {
	return &proto.Control{V: proto.Version, Op: c.Op, JobID: c.JobID, Signal: c.Signal, Data: c.Data, Close: c.Close, Size: wireTTYSize(c.Size)}
}

func domainControlReply(r *proto.ControlReply) *coordinator.ControlReply {
	return &coordinator.ControlReply{Code: r.Code, Message: r.Message}
}

func domainEvent(e *proto.Event) *coordinator.Event {
	d := &coordinator.Event{
		Kind: e.Kind, JobID: e.JobID, Runner: e.Runner, Claim: e.Claim, Time: e.Time, Pid: e.Pid,
		ExitCode: e.ExitCode, Signal: e.Signal, Reason: e.Reason, Error: e.Error, OutputBytes: e.OutputBytes,
		Seq: e.Seq, InputSince: e.InputSince,
	}
	if e.Usage != nil {
		d.Usage = &coordinator.Usage{CPUMS: e.Usage.CPUMS, MemoryPeakBytes: e.Usage.MemoryPeakBytes}
	}
	if e.Ports != nil {
		d.Ports = make([]coordinator.Port, len(e.Ports))
		for i, p := range e.Ports {
			d.Ports[i] = coordinator.Port{Address: p.Address, Port: p.Port}
		}
	}
	if s := e.Stages; s != nil {
		d.Stages = &coordinator.Stages{CgroupUS: s.CgroupUS, ExecUS: s.ExecUS, ExitUS: s.ExitUS, SentUS: s.SentUS}
	}
	return d
}

// domainChunk shares c's bytes, as DecodeChunk shares the message's: HandleChunk is done with them
// when it returns.
func domainChunk(c *proto.Chunk) *coordinator.Chunk {
	return &coordinator.Chunk{Runner: c.Runner, JobID: c.JobID, Claim: c.Claim, Offset: c.Offset, Data: c.Data, Stderr: c.Stderr}
}

func domainHeartbeat(h *proto.Heartbeat) *coordinator.Heartbeat {
	return &coordinator.Heartbeat{
		Runner: h.Runner, Pool: h.Pool, Slots: h.Slots, Running: h.Running, Readonly: h.Readonly,
		ReadonlyReason: h.ReadonlyReason, Cgroup: h.Cgroup, Labels: h.Labels, Version: h.Version,
		Draining: h.Draining, Jobs: h.Jobs, Boot: h.Boot,
	}
}
