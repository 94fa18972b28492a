package client

import (
	"context"
	"net/url"
	"strconv"
	"time"
)

// Notification is the API's notification object.
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

// Formats of a notification's text.
const (
	// FormatSystem is the agent-tool <system_notification> format (Cursor's), the default.
	FormatSystem = "system_notification"
	// FormatTask is Claude Code's <task-notification> format.
	FormatTask = "task_notification"
)

// Notifications is a page of notifications and the cursor to ask from next.
type Notifications struct {
	Notifications []Notification `json:"notifications"`
	Next          uint64         `json:"next"`
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

// Path is the path of the long-poll, for Do.
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
	if len(v) == 0 {
		return "/v1/notifications"
	}
	return "/v1/notifications?" + v.Encode()
}

// NotificationsPath is the path of a long-poll, for Do; see Notifications.
func NotificationsPath(session string, after *uint64, wait time.Duration) string {
	return NotificationsQuery{Session: session, After: after, Wait: wait}.Path()
}

// Notifications returns the session's notifications after `after` (nil: after the session's acked
// cursor), waiting up to wait (at most 5 min) for the first (GET /v1/notifications). session ""
// means the client's Session, else default.
func (c *Client) Notifications(ctx context.Context, session string, after *uint64, wait time.Duration) (*Notifications, error) {
	return c.QueryNotifications(ctx, NotificationsQuery{Session: session, After: after, Wait: wait})
}

// QueryNotifications is Notifications with every parameter of the long-poll, the text's format
// among them.
func (c *Client) QueryNotifications(ctx context.Context, q NotificationsQuery) (*Notifications, error) {
	var r Notifications
	if err := c.call(ctx, "GET", q.Path(), nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Ack records that the session's notifications up to seq were delivered (POST /v1/notifications/ack).
func (c *Client) Ack(ctx context.Context, session string, seq uint64) (*Session, error) {
	body := struct {
		Session string `json:"session,omitempty"`
		Seq     uint64 `json:"seq"`
	}{session, seq}
	var r struct {
		Session Session `json:"session"`
	}
	if err := c.call(ctx, "POST", "/v1/notifications/ack", body, &r); err != nil {
		return nil, err
	}
	return &r.Session, nil
}

// OpenSession creates or updates a session with a lease (0: none) (POST /v1/sessions).
func (c *Client) OpenSession(ctx context.Context, id string, lease time.Duration) (*Session, error) {
	return c.OpenSessionWith(ctx, id, lease, "")
}

// OpenSessionWith is OpenSession that also sets the format of the session's notifications
// (FormatSystem or FormatTask; "" keeps it).
func (c *Client) OpenSessionWith(ctx context.Context, id string, lease time.Duration, format string) (*Session, error) {
	body := struct {
		ID      string `json:"id"`
		LeaseMS int64  `json:"lease_ms"`
		Format  string `json:"format,omitempty"`
	}{id, lease.Milliseconds(), format}
	var r struct {
		Session Session `json:"session"`
	}
	if err := c.call(ctx, "POST", "/v1/sessions", body, &r); err != nil {
		return nil, err
	}
	return &r.Session, nil
}

// RenewSession extends a session's lease (POST /v1/sessions/{id}/renew).
func (c *Client) RenewSession(ctx context.Context, id string) (*Session, error) {
	var r struct {
		Session Session `json:"session"`
	}
	if err := c.call(ctx, "POST", SessionPath(id, "/renew"), nil, &r); err != nil {
		return nil, err
	}
	return &r.Session, nil
}

// EndSession ends a session and returns the ids of the jobs it stopped (DELETE /v1/sessions/{id}).
func (c *Client) EndSession(ctx context.Context, id string) ([]string, error) {
	var r struct {
		Stopped []string `json:"stopped"`
	}
	if err := c.call(ctx, "DELETE", SessionPath(id, ""), nil, &r); err != nil {
		return nil, err
	}
	return r.Stopped, nil
}
