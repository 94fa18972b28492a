package client

import (
	"context"
	"time"

	"github.com/sbx-dev/sbx/coordinator/api"
)

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
	var r api.SessionReply
	if err := c.call(ctx, "POST", api.RouteAck, api.AckRequest{Session: session, Seq: seq}, &r); err != nil {
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
	body := api.OpenSessionRequest{ID: id, LeaseMS: lease.Milliseconds(), Format: format}
	var r api.SessionReply
	if err := c.call(ctx, "POST", api.RouteSessions, body, &r); err != nil {
		return nil, err
	}
	return &r.Session, nil
}

// RenewSession extends a session's lease (POST /v1/sessions/{id}/renew).
func (c *Client) RenewSession(ctx context.Context, id string) (*Session, error) {
	var r api.SessionReply
	if err := c.call(ctx, "POST", api.SessionRenewPath(id), nil, &r); err != nil {
		return nil, err
	}
	return &r.Session, nil
}

// EndSession ends a session and returns the ids of the jobs it stopped (DELETE /v1/sessions/{id}).
func (c *Client) EndSession(ctx context.Context, id string) ([]string, error) {
	var r api.EndSessionReply
	if err := c.call(ctx, "DELETE", api.SessionPath(id), nil, &r); err != nil {
		return nil, err
	}
	return r.Stopped, nil
}
