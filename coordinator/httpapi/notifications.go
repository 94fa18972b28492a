package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/api"
)

// streamKeepAlive is how often an idle notification stream sends a comment, so that proxies and
// clients see the connection alive.
const streamKeepAlive = 15 * time.Second

// session is the request's session: the query's or body's field (given), else the Sbx-Session
// header, else default (for a scoped token, its prefix). Each is checked by
// coordinator.CheckSession, as a path's session id is, and held to the credential's scope.
func session(r *http.Request, given string) (string, error) {
	what, id := "session", given
	switch h := r.Header.Get(api.HeaderSession); {
	case given != "":
	case h != "":
		what, id = "Sbx-Session header", h
	case scopeOf(r.Context()) != "":
		return scopeOf(r.Context()), nil
	default:
		return coordinator.DefaultSession, nil
	}
	if err := coordinator.CheckSession(what, id); err != nil {
		return "", err
	}
	return id, inScope(r, what, id)
}

// queryAfter parses the optional after parameter; nil when absent (the session's cursor).
func queryAfter(r *http.Request) (*uint64, error) {
	s := r.URL.Query().Get("after")
	if s == "" {
		return nil, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return nil, invalid("after %q is not a non-negative integer.", s)
	}
	return &n, nil
}

// queryFormat parses the optional format parameter: the format to write each text in ("": as stored).
func queryFormat(r *http.Request) (coordinator.Format, error) {
	return coordinator.ParseFormat("format", r.URL.Query().Get("format"))
}

// handleNotifications is the long-poll: the session's notifications after `after` (default: its
// acked cursor), waiting up to wait_ms for one.
func (s *Server) handleNotifications(w http.ResponseWriter, r *http.Request) {
	after, err := queryAfter(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	wait, err := queryInt(r, "wait_ms", 0, 0, coordinator.MaxNotificationWait.Milliseconds())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	limit, err := queryInt(r, "limit", 0, 1, coordinator.MaxNotificationPage)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	format, err := queryFormat(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	id, err := session(r, r.URL.Query().Get("session"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.svc.TouchSession(id)
	notes, next, err := s.svc.Notifications(r.Context(), coordinator.NotificationQuery{
		Session: id, After: after, Wait: time.Duration(wait) * time.Millisecond, Limit: int(limit), Format: format,
	})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	reply := api.NotificationsReply{Notifications: make([]api.Notification, 0, len(notes)), Next: next}
	for _, n := range notes {
		reply.Notifications = append(reply.Notifications, viewNotification(n))
	}
	writeJSON(w, http.StatusOK, reply)
}

// handleStream sends the session's notifications as Server-Sent Events (id: seq, data: the JSON
// object) from Last-Event-ID, or the after parameter, or the acked cursor, until the client leaves.
// Reading is not acking: the client acks what it handled.
func (s *Server) handleStream(w http.ResponseWriter, r *http.Request) {
	after, err := queryAfter(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	format, err := queryFormat(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if last := r.Header.Get("Last-Event-ID"); last != "" {
		n, err := strconv.ParseUint(last, 10, 64)
		if err != nil {
			s.writeError(w, r, invalid("Last-Event-ID %q is not a notification's seq.", last))
			return
		}
		after = &n
	}
	id, err := session(r, r.URL.Query().Get("session"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx := r.Context()
	// The first read checks the query before the reply starts.
	notes, next, err := s.svc.Notifications(ctx, coordinator.NotificationQuery{Session: id, After: after, Format: format})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	ctl := http.NewResponseController(w)
	for {
		for _, n := range notes {
			// One line of JSON, with the text's < and > as they are (as every JSON reply has them).
			var data bytes.Buffer
			enc := json.NewEncoder(&data)
			enc.SetEscapeHTML(false)
			_ = enc.Encode(viewNotification(n)) // a view of plain fields always encodes
			event := "id: " + strconv.FormatUint(n.Seq, 10) + "\nevent: notification\ndata: " + strings.TrimSuffix(data.String(), "\n") + "\n\n"
			if _, err := w.Write([]byte(event)); err != nil {
				return
			}
		}
		if len(notes) == 0 {
			if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil {
				return
			}
		}
		if ctl.Flush() != nil {
			return
		}
		s.svc.TouchSession(id)
		notes, next, err = s.svc.Notifications(ctx, coordinator.NotificationQuery{Session: id, After: &next, Wait: streamKeepAlive, Format: format})
		if err != nil {
			// The client left or the server is closing; anything else ends the stream too, and the
			// client resumes from its Last-Event-ID.
			if ctx.Err() == nil {
				s.log.Warn("notification stream", "session", id, "err", err)
			}
			return
		}
	}
}

// handleAck moves the session's cursor: every notification up to seq was delivered.
func (s *Server) handleAck(w http.ResponseWriter, r *http.Request) {
	var b api.AckRequest
	if err := decodeBody(r, &b, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	id, err := session(r, b.Session)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.svc.TouchSession(id)
	st, err := s.svc.Ack(r.Context(), id, b.Seq)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.SessionReply{Session: viewSession(st)})
}

// handleOpenSession creates a session, or reopens or updates one, with an optional lease and
// notification format.
func (s *Server) handleOpenSession(w http.ResponseWriter, r *http.Request) {
	var b api.OpenSessionRequest
	if err := decodeBody(r, &b, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if b.ID == "" {
		s.writeError(w, r, invalid("id is required: name the session."))
		return
	}
	if err := coordinator.CheckSession("id", b.ID); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := inScope(r, "id", b.ID); err != nil {
		s.writeError(w, r, err)
		return
	}
	if maxMS := coordinator.MaxLease.Milliseconds(); b.LeaseMS < 0 || b.LeaseMS > maxMS {
		s.writeError(w, r, invalid("lease_ms must be 0 (no lease) or between %d and %d.", coordinator.MinLease.Milliseconds(), maxMS))
		return
	}
	st, err := s.svc.OpenSessionWith(r.Context(), b.ID, time.Duration(b.LeaseMS)*time.Millisecond, coordinator.Format(b.Format))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.SessionReply{Session: viewSession(st)})
}

func (s *Server) handleSession(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "session")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	st, err := s.svc.Session(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.SessionReply{Session: viewSession(st)})
}

func (s *Server) handleRenew(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "session")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	st, err := s.svc.RenewSession(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.SessionReply{Session: viewSession(st)})
}

// handleEndSession ends a session: its queued and running jobs stop, with no notifications.
func (s *Server) handleEndSession(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r, "session")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	stopped, err := s.svc.EndSession(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	st, err := s.svc.Session(r.Context(), id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.EndSessionReply{Session: viewSession(st), Stopped: stopped})
}
