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
	// OutputStream keeps every job's output, chunk by chunk, for as long as the job is kept: any
	// coordinator serves any job's output from it.
	OutputStream = "SBX_OUTPUT"
)

// Capabilities a work subject can require.
const (
	CapPlain    = "plain"
	CapReadonly = "readonly"
)

// WorkSubjects matches every subject WorkStream stores work under: sbx.v1.work.>
const WorkSubjects = "sbx.v1.work.>"

// WorkIngest is where the coordinator queues work for a pool and capability:
// sbx.v1.queue.<key>.<pool>.<capability>. WorkStream takes in WorkIngestSubjects(key) only and
// stores each message under WorkSubject (a subject transform), which its consumers filter on. The
// key is random and kept in the stream's configuration, which only the coordinator may read: a
// runner cannot aim anything at the stream, not even JetStream's answers to its own requests, whose
// reply subject it chooses (a stream stores whatever reaches its subjects, from whomever).
func WorkIngest(key, pool, capability string) string {
	return "sbx.v1.queue." + key + "." + pool + "." + capability
}

// WorkIngestSubjects is WorkStream's subjects for a key: sbx.v1.queue.<key>.>
func WorkIngestSubjects(key string) string {
	return "sbx.v1.queue." + key + ".>"
}

// WorkKeyOf returns the key of WorkIngestSubjects(key).
func WorkKeyOf(subjects string) (string, bool) {
	rest, found := strings.CutPrefix(subjects, "sbx.v1.queue.")
	key, found2 := strings.CutSuffix(rest, ".>")
	if !found || !found2 || !ValidToken(key) {
		return "", false
	}
	return key, true
}

// OutputSubjects matches every subject OutputStream stores chunks under: sbx.v1.output.>
const OutputSubjects = "sbx.v1.output.>"

// JobOutputSubject is where OutputStream stores the chunks of a job, each with its offset
// (HeaderOffset): sbx.v1.output.<job>. Readers filter on it; the coordinator publishes on
// OutputIngest.
func JobOutputSubject(job string) string {
	return "sbx.v1.output." + job
}

// OutputIngest is where the coordinator publishes a job's output chunks: sbx.v1.keep.<key>.<job>.
// OutputStream takes in OutputIngestSubjects(key) only and stores each chunk under
// JobOutputSubject (a subject transform), for the reason WorkIngest gives: a runner can aim
// JetStream's answers to its publishes at any subject, so a stream whose subjects it could name
// would store what it wants there.
func OutputIngest(key, job string) string {
	return "sbx.v1.keep." + key + "." + job
}

// OutputIngestSubjects is OutputStream's subjects for a key: sbx.v1.keep.<key>.>
func OutputIngestSubjects(key string) string {
	return "sbx.v1.keep." + key + ".>"
}

// OutputKeyOf returns the key of OutputIngestSubjects(key).
func OutputKeyOf(subjects string) (string, bool) {
	rest, found := strings.CutPrefix(subjects, "sbx.v1.keep.")
	key, found2 := strings.CutSuffix(rest, ".>")
	if !found || !found2 || !ValidToken(key) {
		return "", false
	}
	return key, true
}

// EventSubjects is the subject filter of EventStream: sbx.v1.events.>
const EventSubjects = "sbx.v1.events.>"

// HeartbeatSubjects matches every runner's heartbeat: sbx.v1.heartbeat.*.*
const HeartbeatSubjects = "sbx.v1.heartbeat.*.*"

// WorkSubject is the subject work for a pool and capability is stored under, and its consumer's
// filter: sbx.v1.work.<pool>.<capability> (it is queued on WorkIngest).
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

// HeartbeatSubject is where a runner of a pool announces itself: sbx.v1.heartbeat.<runner>.<pool>.
// The pool is in the subject so that NATS permissions can hold a runner to the pools of its creds:
// the coordinator creates work consumers for the pools heartbeats name.
func HeartbeatSubject(runnerID, pool string) string {
	return "sbx.v1.heartbeat." + runnerID + "." + pool
}

// ControlSubject is the request/reply subject of one runner: sbx.v1.control.<runner>
func ControlSubject(runnerID string) string {
	return "sbx.v1.control." + runnerID
}

// ConfirmSubject is where a runner asks the coordinator whether to start an expired Work message
// (Control with OpConfirm): sbx.v1.confirm.<runner>. The runner is in the subject so that the
// coordinator answers only into that runner's inbox (RunnerInbox): NATS permissions bound a
// publish's subject, never its reply, and the coordinator may publish where runners may not.
func ConfirmSubject(runnerID string) string {
	return "sbx.v1.confirm." + runnerID
}

// ConfirmSubjects matches every runner's confirmation requests: sbx.v1.confirm.*
const ConfirmSubjects = "sbx.v1.confirm.*"

// RunnerInbox is the inbox prefix of a runner's connection (nats.CustomInboxPrefix): _INBOX_<runner>.
// Only that runner may subscribe under it, and the coordinator sends a runner's replies and work
// nowhere else.
func RunnerInbox(runnerID string) string {
	return "_INBOX_" + runnerID
}

// PullPrefix is the JetStream API prefix through which a runner binds to and pulls from the work
// consumers: sbx.v1.pull.<runner>. The coordinator forwards sbx.v1.pull.<runner>.CONSUMER.INFO.<stream>.<consumer>
// and sbx.v1.pull.<runner>.CONSUMER.MSG.NEXT.<stream>.<consumer> of WorkStream to $JS.API when the
// request's reply is in the runner's inbox: so JetStream delivers work to that runner only, and a
// runner cannot point a delivery at a stream's subjects.
func PullPrefix(runnerID string) string {
	return "sbx.v1.pull." + runnerID
}

// PullSubjects matches every runner's forwarded JetStream requests: sbx.v1.pull.>
const PullSubjects = "sbx.v1.pull.>"

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

// ParseHeartbeatSubject returns the runner and pool of a heartbeat subject
// (sbx.v1.heartbeat.<runner>.<pool>).
func ParseHeartbeatSubject(subject string) (runnerID, pool string, ok bool) {
	rest, found := strings.CutPrefix(subject, "sbx.v1.heartbeat.")
	if !found {
		return "", "", false
	}
	runnerID, pool, found = strings.Cut(rest, ".")
	if !found || !ValidToken(runnerID) || !ValidToken(pool) {
		return "", "", false
	}
	return runnerID, pool, true
}

// RunnerFromConfirm returns the runner of a confirmation subject (sbx.v1.confirm.<runner>).
func RunnerFromConfirm(subject string) (string, bool) {
	id, found := strings.CutPrefix(subject, "sbx.v1.confirm.")
	if !found || !ValidToken(id) {
		return "", false
	}
	return id, true
}

// ParseWorkConsumer splits a work consumer's name (WorkConsumer) into its pool and capability.
func ParseWorkConsumer(name string) (pool, capability string, ok bool) {
	rest, found := strings.CutPrefix(name, "work_")
	if !found {
		return "", "", false
	}
	i := strings.LastIndexByte(rest, '_')
	if i < 0 {
		return "", "", false
	}
	pool, capability = rest[:i], rest[i+1:]
	if !ValidToken(pool) || capability != CapPlain && capability != CapReadonly {
		return "", "", false
	}
	return pool, capability, true
}
