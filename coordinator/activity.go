package coordinator

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// activityLocked applies an activity event (proto.EventActivity): what the runner sees of the job's
// processes in /proc. The job's ports become the event's, and each port it had not listed yet is
// notified once (kind port); the time it began to wait for input is kept for checkNotes, which
// turns a wait of InputStallAfter into the job's stall notification. lc.mu is held.
func (lc *lifecycle) activityLocked(ctx context.Context, l *liveJob, e *Event) error {
	j := l.job
	if j.Status == StatusQueued {
		return ErrNotReady // its started event is still to come
	}
	if e.Seq <= l.activitySeq {
		return nil // an older one, delivered again
	}
	l.activitySeq = e.Seq
	if e.InputSince == nil {
		l.inputSince = time.Time{}
	} else if l.inputSince.IsZero() {
		// By the coordinator's clock: the runner's need not agree with it.
		l.inputSince = lc.cfg.Now().Add(-e.inputFor())
	}
	if slices.Equal(j.Ports, e.Ports) {
		return nil
	}
	var notes []note
	for _, p := range e.Ports {
		key := portText(p)
		if l.portsSeen[key] || slices.Contains(j.Ports, p) || len(l.portsSeen) >= MaxPortNotes {
			continue
		}
		if l.portsSeen == nil {
			l.portsSeen = map[string]bool{}
		}
		l.portsSeen[key] = true
		notes = append(notes, portNote(j, p))
	}
	j.Ports = slices.Clone(e.Ports)
	if !l.quiet {
		if err := lc.sessions.deliver(ctx, l.job, notes); err != nil {
			return err
		}
	}
	if err := lc.store.PutJob(ctx, j); err != nil {
		return err
	}
	l.wake()
	return nil
}

// MaxPortNotes bounds the port notifications of one job: a job that opens port after port is
// still listed, but tells the session only of its first ones.
const MaxPortNotes = 20

// portText is "127.0.0.1:5173", or "[::1]:5173".
func portText(p Port) string {
	return net.JoinHostPort(p.Address, strconv.Itoa(p.Port))
}

// portNote is the notification of a port a job began to listen on.
func portNote(j *Job, p Port) note {
	where := portText(p)
	return note{
		kind: KindPort, status: NoteSuccess,
		detail:  "listening on " + where,
		summary: fmt.Sprintf(`Async command "%s" is listening on %s`, j.Title, where),
	}
}

// inputStallLocked sends the stall notification of a job whose processes have all waited for input
// for InputStallAfter, as the runner saw them, whatever its last line looks like. It reports
// whether it did. lc.mu is held.
func (lc *lifecycle) inputStallLocked(ctx context.Context, l *liveJob, now time.Time) bool {
	if l.inputSince.IsZero() || now.Sub(l.inputSince) < lc.cfg.InputStallAfter {
		return false
	}
	tail, err := lc.tailLocked(l)
	if err != nil {
		lc.cfg.Logger.Warn("read output tail", "job", l.job.ID, "err", err)
		return false
	}
	l.stallNotified = true
	n := inputStallNote(l.job, screenText(l.job, tail), now.Sub(l.inputSince).Truncate(time.Second))
	if err := lc.sessions.deliver(ctx, l.job, []note{n}); err != nil {
		lc.cfg.Logger.Error("store stall notification", "job", l.job.ID, "err", err)
	}
	return true
}

// inputStallNote is the stall notification of a job whose processes wait for input: the last
// lines of its output (if any) and how to answer.
func inputStallNote(j *Job, tail []byte, waited time.Duration) note {
	text := strings.TrimRight(strings.ReplaceAll(string(tail), "\r", ""), " \t\n")
	last := "(no output)"
	if text != "" {
		lines := strings.Split(text, "\n")
		if len(lines) > stallTail {
			lines = lines[len(lines)-stallTail:]
		}
		for i, l := range lines {
			lines[i] = describe(l, "line")
		}
		last = strings.Join(lines, "\n")
	}
	advice := fmt.Sprintf("Answer it with `sbx send %s TEXT` (a line; --close sends EOF), POST /v1/jobs/%s/stdin {\"data\": \"TEXT\\n\"}, "+
		"or the send tool ({\"id\": \"%s\", \"text\": \"TEXT\\n\"}); or kill it and re-run it with its input given or a non-interactive flag.", j.ID, j.ID, j.ID)
	return note{
		kind: KindStall, status: NoteError,
		detail: fmt.Sprintf("The command is waiting for input: all its processes have been blocked reading its %s for %s. Last output:\n%s\n\n%s",
			inputName(j), waited.Round(time.Second), last, advice),
		summary: `Async command "` + j.Title + `" is waiting for input`,
		event:   last,
		advice:  advice,
	}
}

// inputName names what a job reads its input from.
func inputName(j *Job) string {
	if j.TTY {
		return "terminal"
	}
	return "standard input"
}
