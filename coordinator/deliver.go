package coordinator

import (
	"context"
	"crypto/rand"
)

// addNotesLocked stores notes about l's job and wakes the readers of notifications. s.mu is held.
//
// A finished notification's id is the job's id and "-finished": stored again (an exit event applied
// again after a crash), it is recognised and not repeated. The other kinds come from output that is
// matched once per life of the coordinator, and get a random id.
func (s *Service) addNotesLocked(ctx context.Context, l *liveJob, notes []note) error {
	if len(notes) == 0 {
		return nil
	}
	j := l.job
	now := s.cfg.Now()
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
			ToolCallID: j.ToolCallID, Format: s.formatLocked(j),
		}
		nn.Text = RenderAs(nn, nn.Format)
		all = append(all, nn)
	}
	if err := s.jobs.AddNotifications(ctx, all); err != nil {
		return err
	}
	st, ok := s.sessions[j.Session]
	if !ok {
		st = &Session{ID: j.Session, CreatedAt: now}
	} else {
		st = st.copy()
	}
	for _, n := range all {
		st.LastSeq = max(st.LastSeq, n.Seq)
	}
	s.sessions[j.Session] = st
	close(s.notesChanged)
	s.notesChanged = make(chan struct{})
	return nil
}

// formatLocked is the format of a job's notifications: the one its start asked for, else its
// session's, else <system_notification>. s.mu is held.
func (s *Service) formatLocked(j *Job) Format {
	if j.NotificationFormat != "" {
		return j.NotificationFormat
	}
	if st, ok := s.sessions[j.Session]; ok && st.Format != "" {
		return st.Format
	}
	return FormatSystem
}

// endNotified reports whether the job's last notification was already sent before its end: a
// monitor stopped for printing too much says so once, and its end adds nothing (the tools send one
// terminal notice).
func (l *liveJob) endNotified() bool {
	return l.watch != nil && l.watch.monStopped
}

// checkNotes closes the debounce windows whose time has come and checks for stalls (stall.go).
func (s *Service) checkNotes(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	for _, l := range s.live {
		if l.quiet {
			continue
		}
		if l.watch != nil {
			l.watch.tick(now)
			if err := s.addNotesLocked(ctx, l, l.watch.take()); err != nil {
				s.cfg.Logger.Error("store output notification", "job", l.job.ID, "err", err)
			}
		}
		s.checkStallLocked(ctx, l, now)
	}
}
