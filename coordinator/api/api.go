// Package api is the wire contract of sbx's HTTP API (docs/api.md, coordinator/httpapi/openapi.json):
// each request and reply body, declared once for the server (coordinator/httpapi) and the Go client
// (coordinator/client), the routes and the paths built from them, and the headers. It holds no
// behaviour of either side and imports only the standard library, so that a client depends on the
// API and not on the server's code.
package api

import (
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The API's routes, as http.ServeMux patterns: {id} is a job's or a session's id. The server
// registers them with their methods; a client builds a route's path with the function named after it.
const (
	RouteJobs                = "/v1/jobs"
	RouteJob                 = "/v1/jobs/{id}"
	RouteJobWait             = "/v1/jobs/{id}/wait"
	RouteJobOutput           = "/v1/jobs/{id}/output"
	RouteJobKill             = "/v1/jobs/{id}/kill"
	RouteJobStdin            = "/v1/jobs/{id}/stdin"
	RouteJobResize           = "/v1/jobs/{id}/resize"
	RouteSleep               = "/v1/wait"
	RouteNotifications       = "/v1/notifications"
	RouteNotificationsStream = "/v1/notifications/stream"
	RouteAck                 = "/v1/notifications/ack"
	RouteSessions            = "/v1/sessions"
	RouteSession             = "/v1/sessions/{id}"
	RouteSessionRenew        = "/v1/sessions/{id}/renew"
	RouteRunners             = "/v1/runners"
	RouteEnroll              = "/v1/enroll"
	RouteOpenAPI             = "/v1/openapi.json"
	RouteHealthz             = "/healthz"
	RouteReadyz              = "/readyz"
	RouteMetrics             = "/metrics"
)

// Headers of the API besides the standard ones.
const (
	// HeaderSession names the session of a request that names none in its query or body.
	HeaderSession = "Sbx-Session"
	// HeaderIdempotencyKey makes a start's repeat get the first one's job (StartRequest.IdempotencyKey).
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderOutputLength is the size of a job's output when an output reply starts.
	HeaderOutputLength = "Sbx-Output-Length"
)

// withID is route with its {id} filled in.
func withID(route, id string) string { return strings.Replace(route, "{id}", escapeID(id), 1) }

// escapeID makes id one path segment, whatever it holds: url.PathEscape, and dots escaped too, so
// that "." and ".." reach the server as ids (which it refuses) rather than as segments that move
// the path to another route.
func escapeID(id string) string { return strings.ReplaceAll(url.PathEscape(id), ".", "%2E") }

// withQuery is path followed by v's query, if any.
func withQuery(path string, v url.Values) string {
	if len(v) == 0 {
		return path
	}
	return path + "?" + v.Encode()
}

// JobPath is the path of a job: RouteJob.
func JobPath(id string) string { return withID(RouteJob, id) }

// JobWaitPath is the path of a wait on a job (RouteJobWait): until it ends, pattern ("": none)
// matches its output, it listens on port (a number, or "any"; "": no port), or timeout passes (a
// negative one: the server's default).
func JobWaitPath(id string, timeout time.Duration, pattern, port string) string {
	v := url.Values{}
	if port != "" {
		v.Set("port", port)
	}
	if timeout >= 0 {
		v.Set("timeout_ms", strconv.FormatInt(timeout.Milliseconds(), 10))
	}
	if pattern != "" {
		v.Set("pattern", pattern)
	}
	return withQuery(withID(RouteJobWait, id), v)
}

// JobOutputPath is the path of at most limit bytes of a job's output from offset (limit < 0: all
// there is): RouteJobOutput.
func JobOutputPath(id string, offset, limit int64) string {
	v := url.Values{}
	v.Set("offset", strconv.FormatInt(offset, 10))
	if limit >= 0 {
		v.Set("limit", strconv.FormatInt(limit, 10))
	}
	return withQuery(withID(RouteJobOutput, id), v)
}

// JobFollowPath is the path of a job's output from offset as it comes, until the job ends:
// RouteJobOutput with follow=true.
func JobFollowPath(id string, offset int64) string {
	return withID(RouteJobOutput, id) + "?follow=true&offset=" + strconv.FormatInt(offset, 10)
}

// JobKillPath is the path of a job's kill: RouteJobKill.
func JobKillPath(id string) string { return withID(RouteJobKill, id) }

// JobStdinPath is the path of a job's standard input: RouteJobStdin.
func JobStdinPath(id string) string { return withID(RouteJobStdin, id) }

// JobResizePath is the path of a job's terminal size: RouteJobResize.
func JobResizePath(id string) string { return withID(RouteJobResize, id) }

// SleepPath is the path of a wait of timeout without a job: RouteSleep.
func SleepPath(timeout time.Duration) string {
	return RouteSleep + "?timeout_ms=" + strconv.FormatInt(timeout.Milliseconds(), 10)
}

// SessionPath is the path of a session: RouteSession.
func SessionPath(id string) string { return withID(RouteSession, id) }

// SessionRenewPath is the path of a session's renewal: RouteSessionRenew.
func SessionRenewPath(id string) string { return withID(RouteSessionRenew, id) }

// ErrorReply is the body of every error reply (the document's Error).
type ErrorReply struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is an error reply's code ("invalid", "not_found", "conflict", ...) and its one
// clear sentence.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Health is the reply of RouteHealthz: the process serves.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version,omitempty"`
}

// Ready is the reply of RouteReadyz: Health and the coordinator's role, whether it leads and which
// one does ("" while none is known).
type Ready struct {
	Status   string `json:"status"`
	Version  string `json:"version,omitempty"`
	Leader   bool   `json:"leader"`
	LeaderID string `json:"leader_id,omitempty"`
}
