package coordinator

import (
	"context"
	"crypto/rand"
	"sync"
	"time"
)

// sessionBook is the part of the coordinator that owns the sessions and the delivery of their
// notifications. Its guarantees, each held under its one mutex:
//
//   - Seqs in order: notifications are stored (deliver) one batch at a time, the store giving each
//     the next seq of its session, and the session's LastSeq moves up only once the store took
//     them (bucket first, then cache: docs/store.md). A reader never sees a LastSeq whose
//     notification is not stored.
//   - A cursor only moves forward: ack refuses a seq past LastSeq and ignores one below Acked.
//   - One finished notification per job: its id is the job's id and "-finished", so that one stored
//     again (an exit event applied again after a crash) keeps its first seq; the jobs' part decides
//     whether the end notifies at all (lifecycle: observers).
//
// It calls no other part: it is last but the budget in the lock order (service.go).
type sessionBook struct {
	cfg   *Config
	store Store

	mu   sync.Mutex
	byID map[string]*Session // handed out only as copies
	// changed is closed and replaced whenever a notification is stored.
	changed chan struct{}
}

// newSessionBook loads the sessions of an earlier life from the store.
func newSessionBook(ctx context.Context, cfg *Config, store Store) (*sessionBook, error) {
	b := &sessionBook{cfg: cfg, store: store, byID: map[string]*Session{}, changed: make(chan struct{})}
	sessions, err := store.Sessions(ctx)
	if err != nil {
		return nil, err
	}
	now := cfg.Now()
	for _, st := range sessions {
		if st.ExpiresAt != nil {
			// Renewals made in memory were lost with the process: give the lease a full length again.
			if at := now.Add(time.Duration(st.LeaseMS) * time.Millisecond); at.After(*st.ExpiresAt) {
				st.ExpiresAt = &at
			}
		}
		b.byID[st.ID] = st
	}
	return b, nil
}

// open makes sure session id is open: created (and stored) when new, reopened when it had ended.
func (b *sessionBook) open(ctx context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, err := b.openLocked(ctx, id)
	return err
}

// openLocked is open; it returns the session itself, not a copy. b.mu is held.
func (b *sessionBook) openLocked(ctx context.Context, id string) (*Session, error) {
	st, ok := b.byID[id]
	if ok && st.EndedAt == nil {
		return st, nil
	}
	if !ok {
		st = &Session{ID: id, CreatedAt: b.cfg.Now()}
	} else {
		st = st.copy()
		st.EndedAt = nil
	}
	if err := b.store.PutSession(ctx, st); err != nil {
		return nil, err
	}
	b.byID[id] = st
	return st, nil
}

// openWith opens session id with a lease (0: none) and, when format is not "", a format.
func (b *sessionBook) openWith(ctx context.Context, id string, lease time.Duration, format Format) (*Session, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st, err := b.openLocked(ctx, id)
	if err != nil {
		return nil, err
	}
	st = st.copy()
	st.LeaseMS = lease.Milliseconds()
	if format != "" {
		st.Format = format
	}
	st.ExpiresAt = nil
	if lease > 0 {
		at := b.cfg.Now().Add(lease)
		st.ExpiresAt = &at
	}
	if err := b.store.PutSession(ctx, st); err != nil {
		return nil, err
	}
	b.byID[id] = st
	return st.copy(), nil
}

// get returns a copy of session id.
func (b *sessionBook) get(id string) (*Session, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st, ok := b.byID[id]
	if !ok {
		return nil, Errorf(ENOTFOUND, "Session %q does not exist.", id)
	}
	return st.copy(), nil
}

// renew extends session id's lease by its length from now, and stores it.
func (b *sessionBook) renew(ctx context.Context, id string) (*Session, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st, ok := b.byID[id]
	if !ok {
		return nil, Errorf(ENOTFOUND, "Session %q does not exist.", id)
	}
	if st.EndedAt != nil {
		return nil, Errorf(ECONFLICT, "Session %q has ended.", id)
	}
	if st.LeaseMS > 0 {
		st = st.copy()
		at := b.cfg.Now().Add(time.Duration(st.LeaseMS) * time.Millisecond)
		st.ExpiresAt = &at
		if err := b.store.PutSession(ctx, st); err != nil {
			return nil, err
		}
		b.byID[id] = st
	}
	return st.copy(), nil
}

// touch renews session id's lease in memory only.
func (b *sessionBook) touch(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st, ok := b.byID[id]; ok && st.EndedAt == nil && st.LeaseMS > 0 {
		at := b.cfg.Now().Add(time.Duration(st.LeaseMS) * time.Millisecond)
		st.ExpiresAt = &at
	}
}

// end marks session id ended, and stores it. Its jobs are the caller's (Service.EndSession).
func (b *sessionBook) end(ctx context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	st, ok := b.byID[id]
	if !ok {
		return Errorf(ENOTFOUND, "Session %q does not exist.", id)
	}
	st = st.copy()
	now := b.cfg.Now()
	st.EndedAt, st.ExpiresAt = &now, nil
	if err := b.store.PutSession(ctx, st); err != nil {
		return err
	}
	b.byID[id] = st
	return nil
}

// expired lists the open sessions whose lease ran out by now.
func (b *sessionBook) expired(now time.Time) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ids []string
	for id, st := range b.byID {
		if st.EndedAt == nil && st.ExpiresAt != nil && !now.Before(*st.ExpiresAt) {
			ids = append(ids, id)
		}
	}
	return ids
}

// ack moves session id's cursor to seq. The cursor never moves back; a seq beyond the last
// notification is an error.
func (b *sessionBook) ack(ctx context.Context, id string, seq uint64) (*Session, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st, ok := b.byID[id]
	if !ok {
		return nil, Errorf(ENOTFOUND, "Session %q does not exist.", id)
	}
	if seq > st.LastSeq {
		return nil, Errorf(EINVALID, "seq %d is beyond the last notification of session %q (%d).", seq, id, st.LastSeq)
	}
	if seq > st.Acked {
		st = st.copy()
		st.Acked = seq
		if err := b.store.PutSession(ctx, st); err != nil {
			return nil, err
		}
		b.byID[id] = st
	}
	return st.copy(), nil
}

// cursor returns session id's last seq and acked cursor (zero for an unknown session) and a
// channel closed when the next notification is stored.
func (b *sessionBook) cursor(id string) (last, acked uint64, changed <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st, ok := b.byID[id]; ok {
		last, acked = st.LastSeq, st.Acked
	}
	return last, acked, b.changed
}

// deliver stores notes about job j and wakes the readers of notifications. The caller holds j
// still: the jobs' part, whose lock comes before this part's.
//
// A finished notification's id is the job's id and "-finished": stored again (an exit event applied
// again after a crash), it is recognised and not repeated. The other kinds come from output that is
// matched once per life of the coordinator, and get a random id.
func (b *sessionBook) deliver(ctx context.Context, j *Job, notes []note) error {
	if len(notes) == 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.cfg.Now()
	all := make([]*Notification, 0, len(notes))
	for _, n := range notes {
		id := j.ID + "-finished"
		if n.kind != KindFinished {
			id = j.ID + "-" + string(n.kind) + "-" + rand.Text()[:10]
		}
		title := n.title
		if title == "" {
			title = j.Title
		}
		nn := &Notification{
			ID: id, Session: j.Session, Kind: n.kind, Status: n.status, JobID: j.ID, Title: title,
			Detail: n.detail, OutputPath: j.OutputPath, CreatedAt: now, Summary: n.summary, Event: n.event, Advice: n.advice,
			ToolCallID: j.ToolCallID, Format: b.formatLocked(j),
		}
		nn.Text = RenderAs(nn, nn.Format)
		all = append(all, nn)
	}
	if err := b.store.AddNotifications(ctx, all); err != nil {
		return err
	}
	st, ok := b.byID[j.Session]
	if !ok {
		st = &Session{ID: j.Session, CreatedAt: now}
	} else {
		st = st.copy()
	}
	for _, n := range all {
		st.LastSeq = max(st.LastSeq, n.Seq)
	}
	b.byID[j.Session] = st
	close(b.changed)
	b.changed = make(chan struct{})
	return nil
}

// formatLocked is the format of a job's notifications: the one its start asked for, else its
// session's, else <system_notification>. b.mu is held.
func (b *sessionBook) formatLocked(j *Job) Format {
	if j.NotificationFormat != "" {
		return j.NotificationFormat
	}
	if st, ok := b.byID[j.Session]; ok && st.Format != "" {
		return st.Format
	}
	return FormatSystem
}
