package api

import (
	"net/url"
	"strconv"
	"time"
)

// Formats of a notification's text.
const (
	// FormatSystem is the agent-tool <system_notification> format (Cursor's), the default.
	FormatSystem = "system_notification"
	// FormatTask is Claude Code's <task-notification> format.
	FormatTask = "task_notification"
)

// Notification is the API's notification object (docs/api.md "Notification object"), in a page of
// RouteNotifications and in each event of RouteNotificationsStream.
type Notification struct {
	Seq        uint64    `json:"seq"`
	ID         string    `json:"id"`
	Session    string    `json:"session"`
	Kind       string    `json:"kind"`
	Status     string    `json:"status"`
	JobID      string    `json:"job_id"`
	Title      string    `json:"title"`
	Detail     string    `json:"detail"`
	OutputPath string    `json:"output_path"`
	CreatedAt  time.Time `json:"created_at"`
	// Format is the format Text is written in: FormatSystem or FormatTask.
	Format string `json:"format"`
	Text   string `json:"text"`
	// ToolCallID is the tool call that started the job, when its start named one.
	ToolCallID string `json:"tool_call_id,omitempty"`
}

// NotificationsReply is a page of notifications and the cursor to ask from next.
type NotificationsReply struct {
	Notifications []Notification `json:"notifications"`
	Next          uint64         `json:"next"`
}

// NotificationsQuery selects notifications: the session's after After (nil: after its acked
// cursor), waiting up to Wait for the first, at most Limit (0: the server's maximum), with their
// text in Format ("": each as it was stored).
type NotificationsQuery struct {
	Session string
	After   *uint64
	Wait    time.Duration
	Limit   int
	Format  string
}

// Path is the path of the long-poll: RouteNotifications with the query.
func (q NotificationsQuery) Path() string {
	v := url.Values{}
	if q.Session != "" {
		v.Set("session", q.Session)
	}
	if q.After != nil {
		v.Set("after", strconv.FormatUint(*q.After, 10))
	}
	if q.Wait > 0 {
		v.Set("wait_ms", strconv.FormatInt(q.Wait.Milliseconds(), 10))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if q.Format != "" {
		v.Set("format", q.Format)
	}
	return withQuery(RouteNotifications, v)
}

// AckRequest is the body of RouteAck: the session's notifications up to Seq were delivered.
// Session "" is HeaderSession's, else default.
type AckRequest struct {
	Session string `json:"session,omitempty"`
	Seq     uint64 `json:"seq"`
}

// Session is the API's session object.
type Session struct {
	ID        string     `json:"id"`
	CreatedAt time.Time  `json:"created_at"`
	LeaseMS   int64      `json:"lease_ms"`
	ExpiresAt *time.Time `json:"expires_at"`
	EndedAt   *time.Time `json:"ended_at"`
	Acked     uint64     `json:"acked"`
	LastSeq   uint64     `json:"last_seq"`
	// Format is the format of the session's notifications.
	Format string `json:"format"`
}

// OpenSessionRequest is the body of POST RouteSessions: it creates or updates the session ID with
// a lease (0: none) and the format of its notifications ("": kept).
type OpenSessionRequest struct {
	ID      string `json:"id"`
	LeaseMS int64  `json:"lease_ms"`
	Format  string `json:"format,omitempty"`
}

// SessionReply is the reply to an ack, and to a session's opening, reading and renewal.
type SessionReply struct {
	Session Session `json:"session"`
}

// EndSessionReply is the reply to DELETE RouteSession: the ended session and the ids of the jobs
// its end stopped.
type EndSessionReply struct {
	Session Session  `json:"session"`
	Stopped []string `json:"stopped"`
}
