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
	Text       string    `json:"text"`
}

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
}

// NotificationsPath is the path of a long-poll, for Do; see Notifications.
func NotificationsPath(session string, after *uint64, wait time.Duration) string {
	v := url.Values{}
	if session != "" {
		v.Set("session", session)
	}
	if after != nil {
		v.Set("after", strconv.FormatUint(*after, 10))
	}
	if wait > 0 {
		v.Set("wait_ms", strconv.FormatInt(wait.Milliseconds(), 10))
	}
	if len(v) == 0 {
		return "/v1/notifications"
	}
	return "/v1/notifications?" + v.Encode()
}

// Notifications returns the session's notifications after `after` (nil: after the session's acked
// cursor), waiting up to wait (at most 5 min) for the first (GET /v1/notifications). session ""
// means the client's Session, else default.
func (c *Client) Notifications(ctx context.Context, session string, after *uint64, wait time.Duration) (*Notifications, error) {
	var r Notifications
	if err := c.call(ctx, "GET", NotificationsPath(session, after, wait), nil, &r); err != nil {
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
	body := struct {
		ID      string `json:"id"`
		LeaseMS int64  `json:"lease_ms"`
	}{id, lease.Milliseconds()}
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
