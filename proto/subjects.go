// Package proto is the wire contract between the coordinator and the runners: NATS subjects, stream
// names, header names and the versioned messages with their validating decoders. It imports only the
// standard library; it is the one thing the two halves share.
package proto

import "strings"

// Version is the wire version carried by every message ("v" in JSON, Sbx-Version in headers) and the
// second token of every subject.
const Version = 1

// Stream names.
const (
	// WorkStream is the work-queue stream holding jobs not yet taken by a runner.
	WorkStream = "SBX_WORK"
	// EventStream holds state events and output chunks until the coordinator has stored them.
	EventStream = "SBX_EVENTS"
)

// Capabilities a work subject can require.
const (
	CapPlain    = "plain"
	CapReadonly = "readonly"
)

// WorkSubjects is the subject filter of WorkStream: sbx.v1.work.>
const WorkSubjects = "sbx.v1.work.>"

// EventSubjects is the subject filter of EventStream: sbx.v1.events.>
const EventSubjects = "sbx.v1.events.>"

// HeartbeatSubjects matches every runner's heartbeat: sbx.v1.heartbeat.*
const HeartbeatSubjects = "sbx.v1.heartbeat.*"

// WorkSubject is where work for a pool and capability is queued: sbx.v1.work.<pool>.<capability>
func WorkSubject(pool, capability string) string {
	return "sbx.v1.work." + pool + "." + capability
}

// StateSubject carries the state events of a job run by a runner: sbx.v1.events.<runner>.<job>.state.
// The runner is in the subject so that NATS permissions can hold each runner to its own events.
func StateSubject(runnerID, jobID string) string {
	return "sbx.v1.events." + runnerID + "." + jobID + ".state"
}

// OutputSubject carries the output chunks of a job run by a runner: sbx.v1.events.<runner>.<job>.out
func OutputSubject(runnerID, jobID string) string {
	return "sbx.v1.events." + runnerID + "." + jobID + ".out"
}

// RunnerEventSubjects matches every event one runner may publish: sbx.v1.events.<runner>.>
func RunnerEventSubjects(runnerID string) string {
	return "sbx.v1.events." + runnerID + ".>"
}

// HeartbeatSubject is where a runner announces itself: sbx.v1.heartbeat.<runner>
func HeartbeatSubject(runnerID string) string {
	return "sbx.v1.heartbeat." + runnerID
}

// ControlSubject is the request/reply subject of one runner: sbx.v1.control.<runner>
func ControlSubject(runnerID string) string {
	return "sbx.v1.control." + runnerID
}

// ConfirmSubject is where a runner asks the coordinator whether to start an expired Work message
// (Control with OpConfirm): sbx.v1.confirm
const ConfirmSubject = "sbx.v1.confirm"

// WorkConsumer is the durable pull consumer shared by every runner of a pool for one capability:
// work_<pool>_<capability>. A work-queue stream refuses overlapping consumers, so runners share it.
func WorkConsumer(pool, capability string) string {
	return "work_" + pool + "_" + capability
}

// EventConsumer is the coordinator's durable consumer on EventStream.
const EventConsumer = "coordinator"

// ServiceName is the NATS micro service name every runner registers under (`nats micro ls`).
const ServiceName = "sbx-runner"

// Header names.
const (
	// HeaderVersion is the wire version of a work message.
	HeaderVersion = "Sbx-Version"
	// HeaderOffset is an output chunk's byte offset.
	HeaderOffset = "Sbx-Offset"
	// HeaderMsgID is JetStream's de-duplication header.
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderClaim is an output chunk's claim token (Work.Claim).
	HeaderClaim = "Sbx-Claim"
	// HeaderStream names an output chunk's stream when it is not stdout: StreamStderr.
	HeaderStream = "Sbx-Stream"
)

// StreamStderr is HeaderStream's value for standard error's bytes.
const StreamStderr = "stderr"

// ValidToken reports whether s can be one token of a subject and a cgroup name: 1–64 characters of
// [A-Za-z0-9_-]. Job ids, runner ids and pool names must be tokens.
func ValidToken(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Event subject kinds: the last token of StateSubject and OutputSubject.
const (
	KindState  = "state"
	KindOutput = "out"
)

// ParseEventSubject splits an event subject (sbx.v1.events.<runner>.<job>.<state|out>) into the
// runner that published it, the job and the kind.
func ParseEventSubject(subject string) (runnerID, jobID, kind string, ok bool) {
	rest, found := strings.CutPrefix(subject, "sbx.v1.events.")
	if !found {
		return "", "", "", false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 3 || !ValidToken(parts[0]) || !ValidToken(parts[1]) || (parts[2] != KindState && parts[2] != KindOutput) {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// RunnerFromHeartbeat returns the runner of a heartbeat subject (sbx.v1.heartbeat.<runner>).
func RunnerFromHeartbeat(subject string) (string, bool) {
	id, found := strings.CutPrefix(subject, "sbx.v1.heartbeat.")
	if !found || !ValidToken(id) {
		return "", false
	}
	return id, true
}
