package coordinator

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sbx-dev/sbx/proto"
)

// Bounds of sessions and notification reads.
const (
	MinLease = 100 * time.Millisecond
	MaxLease = 7 * 24 * time.Hour
	// MaxNotificationWait bounds a long-poll for notifications.
	MaxNotificationWait = 5 * time.Minute
	// MaxNotificationPage is the most notifications one read returns.
	MaxNotificationPage = 1000
)

// DefaultSession is the session of a job that names none.
const DefaultSession = "default"

// Session groups an agent's jobs and notifications. Acked is the delivery cursor: every notification
// up to it was delivered. A session with a lease ends when nobody renews it before ExpiresAt.
type Session struct {
	ID        string     `json:"id"`
	CreatedAt time.Time  `json:"created_at"`
	LeaseMS   int64      `json:"lease_ms,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	Acked     uint64     `json:"acked"`
	// Format is the format of the session's notifications ("": <system_notification>); a job's
	// start may choose another for its own.
	Format Format `json:"format,omitempty"`
	// LastSeq is the seq of the session's last notification; it is kept with the notifications.
	LastSeq uint64 `json:"-"`
}

func (s *Session) copy() *Session {
	c := *s
	return &c
}

// CheckSession checks a session's id wherever one is taken — a body's or query's field, the
// Sbx-Session header, a path — so that every way in refuses the same ids with the same message;
// what names where it came from ("session", "Sbx-Session header", "session id").
func CheckSession(what, id string) error {
	if !proto.ValidToken(id) {
		return Errorf(EINVALID, "%s %q must be 1-64 characters of letters, digits, '_' and '-'.", what, id)
	}
	return nil
}

func validSession(id string) error { return CheckSession("session", id) }

// OpenSession creates a session, or reopens or updates one, with a lease (0: none). A session with a
// lease ends when it is not renewed within the lease. Its notification format stays as it was.
func (s *Service) OpenSession(ctx context.Context, id string, lease time.Duration) (*Session, error) {
	return s.OpenSessionWith(ctx, id, lease, "")
}

// OpenSessionWith is OpenSession that also sets the format of the session's notifications when
// format is not "": the notifications stored from then on are written in it.
func (s *Service) OpenSessionWith(ctx context.Context, id string, lease time.Duration, format Format) (*Session, error) {
	if err := validSession(id); err != nil {
		return nil, err
	}
	if _, err := ParseFormat("format", string(format)); err != nil {
		return nil, err
	}
	if lease != 0 && (lease < MinLease || lease > MaxLease) {
		return nil, Errorf(EINVALID, "lease_ms must be 0 (no lease) or between %d and %d.", MinLease.Milliseconds(), MaxLease.Milliseconds())
	}
	return s.sessions.openWith(ctx, id, lease, format)
}

// Session returns a session.
func (s *Service) Session(_ context.Context, id string) (*Session, error) {
	return s.sessions.get(id)
}

// RenewSession extends a session's lease by its length from now.
func (s *Service) RenewSession(ctx context.Context, id string) (*Session, error) {
	return s.sessions.renew(ctx, id)
}

// TouchSession renews the lease of a session a call carried, if it has one. The renewal is kept in
// memory; after a restart a lease runs at least its length again.
func (s *Service) TouchSession(id string) {
	s.sessions.touch(id)
}

// EndSession ends a session: its queued jobs are withdrawn and its running jobs stopped, all ending
// aborted with reason session_ended and sending no notification. It returns the ids of those jobs.
func (s *Service) EndSession(ctx context.Context, id string) ([]string, error) {
	ids, err := s.jobs.endSession(ctx, id)
	if err != nil {
		return nil, err
	}

	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, jid := range ids {
		wg.Go(func() {
			err := s.Kill(ctx, jid, "")
			if err != nil && ErrorCode(err) != ECONFLICT {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return ids, errors.Join(errs...)
}

// endExpired ends the sessions whose lease ran out.
func (s *Service) endExpired(ctx context.Context) {
	expired := s.sessions.expired(s.cfg.Now())
	for _, id := range expired {
		s.cfg.Logger.Info("session lease expired", "session", id)
		if _, err := s.EndSession(ctx, id); err != nil {
			s.cfg.Logger.Warn("end expired session", "session", id, "err", err)
		}
	}
}

// Ack records that the session's notifications up to seq were delivered. The cursor never moves
// back; a seq beyond the last notification is an error.
func (s *Service) Ack(ctx context.Context, id string, seq uint64) (*Session, error) {
	return s.sessions.ack(ctx, id, seq)
}

// NotificationQuery selects a session's notifications.
type NotificationQuery struct {
	Session string
	// After selects seq > *After; nil means the session's acked cursor.
	After *uint64
	// Wait is how long to wait for one when there is none yet (0: answer at once).
	Wait  time.Duration
	Limit int
	// Format, when not "", rewrites each notification's text in that format; otherwise the text is
	// in the format it was stored in.
	Format Format
}

// Notifications returns the session's notifications after the cursor, waiting up to q.Wait for the
// first one, and the cursor to ask from next (the last seq returned, or the cursor itself).
func (s *Service) Notifications(ctx context.Context, q NotificationQuery) ([]*Notification, uint64, error) {
	if err := validSession(q.Session); err != nil {
		return nil, 0, err
	}
	if q.Wait < 0 || q.Wait > MaxNotificationWait {
		return nil, 0, Errorf(EINVALID, "wait_ms must be between 0 and %d.", MaxNotificationWait.Milliseconds())
	}
	if q.Limit < 0 || q.Limit > MaxNotificationPage {
		return nil, 0, Errorf(EINVALID, "limit must be between 1 and %d.", MaxNotificationPage)
	}
	if q.Limit == 0 {
		q.Limit = MaxNotificationPage
	}
	if _, err := ParseFormat("format", string(q.Format)); err != nil {
		return nil, 0, err
	}
	var timeout <-chan time.Time
	if q.Wait > 0 {
		t := time.NewTimer(q.Wait)
		defer t.Stop()
		timeout = t.C
	}
	for {
		last, after, changed := s.sessions.cursor(q.Session)
		if q.After != nil {
			after = *q.After
		}
		if after > last {
			return nil, 0, Errorf(EINVALID, "after %d is beyond the last notification of session %q (%d).", after, q.Session, last)
		}
		if last > after {
			notes, err := s.store.Notifications(ctx, q.Session, after, q.Limit)
			if err != nil {
				return nil, 0, err
			}
			if len(notes) > 0 {
				after = notes[len(notes)-1].Seq
			}
			if q.Format != "" {
				for _, n := range notes {
					n.Format, n.Text = q.Format, RenderAs(n, q.Format)
				}
			}
			return notes, after, nil
		}
		if timeout == nil {
			return []*Notification{}, after, nil
		}
		select {
		case <-changed:
		case <-timeout:
			return []*Notification{}, after, nil
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
	}
}
