package coordinator

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sbx-dev/sbx/proto"
)

// Bounds of output notifications (see docs/notifications.md).
const (
	// MaxNotifyPattern and MaxNotifyReason bound notify_on_output's pattern and reason, in characters.
	MaxNotifyPattern = 500
	MaxNotifyReason  = 500
	// DefaultDebounce is the debounce window when the request sets none; it is also the minimum.
	DefaultDebounce = 5 * time.Second
	// MaxDebounce bounds the debounce window.
	MaxDebounce = time.Hour
	// MaxMatches is how many matches of a job are notified; the next one sends the limit notice.
	MaxMatches = 100
	// MaxMatchText is the longest matched line a notification quotes; a longer one is named by length.
	MaxMatchText = 5000
	// maxLine is the longest partial line held; a longer one is handled as a line of its own.
	maxLine = 64 << 10
	// stallTail is how many lines of output a stall notification quotes.
	stallTail = 10
)

// OutputNotify asks for a notification when a line of the job's output matches Pattern (RE2).
type OutputNotify struct {
	Pattern    string `json:"pattern"`
	Reason     string `json:"reason"`
	DebounceMS int64  `json:"debounce_ms"`
}

// validate checks the request's fields and fills defaults; minDebounce is the configured minimum.
func (o *OutputNotify) validate(minDebounce time.Duration) error {
	if o.Pattern == "" {
		return Errorf(EINVALID, "notify_on_output.pattern is required.")
	}
	if n := utf8.RuneCountInString(o.Pattern); n > MaxNotifyPattern {
		return Errorf(EINVALID, "notify_on_output.pattern is %d characters; the limit is %d.", n, MaxNotifyPattern)
	}
	if _, err := regexp.Compile(o.Pattern); err != nil {
		return Errorf(EINVALID, "notify_on_output.pattern is not a valid RE2 expression: %v.", err)
	}
	if n := utf8.RuneCountInString(o.Reason); n > MaxNotifyReason {
		return Errorf(EINVALID, "notify_on_output.reason is %d characters; the limit is %d.", n, MaxNotifyReason)
	}
	if o.Reason == "" {
		o.Reason = o.Pattern
	}
	if o.DebounceMS == 0 {
		o.DebounceMS = DefaultDebounce.Milliseconds()
	}
	if o.DebounceMS < minDebounce.Milliseconds() || o.DebounceMS > MaxDebounce.Milliseconds() {
		return Errorf(EINVALID, "notify_on_output.debounce_ms must be between %d and %d.", minDebounce.Milliseconds(), MaxDebounce.Milliseconds())
	}
	return nil
}

// note is a notification not yet stored: the service fills in the job's fields and the seq.
type note struct {
	kind   NotificationKind
	status string
	detail string
}

// watch follows one job's output line by line: it matches notify_on_output's pattern, debouncing,
// and collects a monitor's lines. It sees only the gap-free body, in order. Its owner holds s.mu.
type watch struct {
	re       *regexp.Regexp
	reason   string
	debounce time.Duration
	partial  []byte

	matches   int       // lines that matched so far
	windowEnd time.Time // end of the debounce window; zero when none is open
	pending   int       // matches inside the window not yet notified
	latest    string    // the latest pending match
	latestN   int       // its occurrence number
	limited   bool      // the limit notice was sent: nothing more

	monitor      bool
	monMax       int
	monWindow    time.Duration
	monStart     time.Time
	monCount     int
	monLines     []string
	monStopped   bool // the monitor went over its rate: it is being stopped
	monKillAsked bool

	notes []note
}

// newWatch returns the watch of a job, or nil when nothing watches its output.
func newWatch(j *Job, cfg *Config) *watch {
	if j.Notify == nil && !j.Monitor {
		return nil
	}
	w := &watch{monitor: j.Monitor, monMax: cfg.MonitorMaxLines, monWindow: cfg.MonitorWindow}
	if j.Notify != nil {
		// The pattern was checked at the start; a stored one that no longer compiles watches nothing.
		re, err := regexp.Compile(j.Notify.Pattern)
		if err == nil {
			w.re, w.reason = re, j.Notify.Reason
			w.debounce = time.Duration(j.Notify.DebounceMS) * time.Millisecond
		}
	}
	return w
}

// feed takes newly contiguous output bytes.
func (w *watch) feed(p []byte, now time.Time) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.partial = append(w.partial, p...)
			if len(w.partial) >= maxLine {
				w.line(string(w.partial), now)
				w.partial = w.partial[:0]
			}
			break
		}
		var line string
		if len(w.partial) > 0 {
			line = string(append(w.partial, p[:i]...))
			w.partial = w.partial[:0]
		} else {
			line = string(p[:i])
		}
		w.line(strings.TrimRight(line, "\r"), now)
		p = p[i+1:]
	}
	w.flushMonitor()
}

// end handles the held partial line and flushes what is pending: the job ended.
func (w *watch) end(now time.Time) {
	if len(w.partial) > 0 {
		w.line(strings.TrimRight(string(w.partial), "\r"), now)
		w.partial = nil
	}
	w.flushMonitor()
	w.flushMatches()
}

// tick closes the debounce window when its time has come, sending what it counted.
func (w *watch) tick(now time.Time) {
	if w.windowEnd.IsZero() || now.Before(w.windowEnd) {
		return
	}
	if w.pending > 0 {
		w.flushMatches()
		w.windowEnd = now.Add(w.debounce)
		return
	}
	w.windowEnd = time.Time{}
}

func (w *watch) line(line string, now time.Time) {
	if w.monitor && !w.monStopped {
		if w.monStart.IsZero() || now.Sub(w.monStart) >= w.monWindow {
			w.monStart, w.monCount = now, 0
		}
		w.monCount++
		if w.monCount > w.monMax {
			w.flushMonitor()
			w.monStopped = true
			w.notes = append(w.notes, note{KindLimit, NoteAborted, fmt.Sprintf(
				"Monitor stopped: more than %d lines in %s; restart with a tighter filter.", w.monMax, w.monWindow)})
		} else {
			w.monLines = append(w.monLines, describe(line, "line"))
		}
	}
	if w.re == nil || w.limited || !w.re.MatchString(line) {
		return
	}
	w.tick(now)
	w.matches++
	if w.matches > MaxMatches {
		w.flushMatches()
		w.limited = true
		w.notes = append(w.notes, note{KindLimit, NoteAborted, fmt.Sprintf(
			"%s: Notification limit reached (%d); further matches are not notified.", w.reason, MaxMatches)})
		return
	}
	if w.windowEnd.IsZero() {
		w.notes = append(w.notes, note{KindOutput, NoteSuccess, fmt.Sprintf(
			"%s (occurrence %d): %s", w.reason, w.matches, describe(line, "matched line"))})
		w.windowEnd = now.Add(w.debounce)
		return
	}
	w.pending++
	w.latest, w.latestN = line, w.matches
}

func (w *watch) flushMatches() {
	if w.pending == 0 {
		return
	}
	times := "times"
	if w.pending == 1 {
		times = "time"
	}
	w.notes = append(w.notes, note{KindOutput, NoteSuccess, fmt.Sprintf(
		"%s: %d more %s since the previous notification; latest (occurrence %d): %s",
		w.reason, w.pending, times, w.latestN, describe(w.latest, "matched line"))})
	w.pending, w.latest = 0, ""
}

func (w *watch) flushMonitor() {
	if len(w.monLines) == 0 {
		return
	}
	w.notes = append(w.notes, note{KindMonitor, NoteSuccess, strings.Join(w.monLines, "\n")})
	w.monLines = nil
}

// take returns the notes collected since the last call.
func (w *watch) take() []note {
	n := w.notes
	w.notes = nil
	return n
}

// describe quotes a line, or names it by its length when it is longer than MaxMatchText characters.
func describe(s, what string) string {
	if n := utf8.RuneCountInString(s); n > MaxMatchText {
		return fmt.Sprintf("(a %s of %d characters)", what, n)
	}
	return s
}

// promptRE recognises a last line that waits for an answer.
var promptRE = regexp.MustCompile(`(?i)\(y/n\)|\[y/n\]|\(yes/no\)|\[yes/no\]|press enter|press any key|continue\?|overwrite\?|are you sure.*\?|password:|passphrase.*:`)

// stallNote returns the stall notification of an output tail whose last line looks like a prompt.
func stallNote(tail []byte, quiet time.Duration) (note, bool) {
	text := strings.ReplaceAll(string(tail), "\r", "")
	text = strings.TrimRight(text, " \t\n")
	lines := strings.Split(text, "\n")
	if len(lines) == 0 || !promptRE.MatchString(lines[len(lines)-1]) {
		return note{}, false
	}
	if len(lines) > stallTail {
		lines = lines[len(lines)-stallTail:]
	}
	for i, l := range lines {
		lines[i] = describe(l, "line")
	}
	return note{KindStall, NoteError, fmt.Sprintf(
		"No output for %s and the last line looks like a prompt waiting for input (stdin is /dev/null); last lines:\n%s",
		quiet.Round(time.Second), strings.Join(lines, "\n"))}, true
}

// finishedNote is the finished notification of an ended job.
func finishedNote(j *Job) note {
	code := ""
	if j.ExitCode != nil {
		code = "exit_code=" + strconv.Itoa(*j.ExitCode)
	}
	switch {
	case j.Status == StatusSucceeded:
		return note{KindFinished, NoteSuccess, code}
	case j.Status == StatusFailed && code != "":
		return note{KindFinished, NoteError, code}
	case j.Status == StatusFailed:
		return note{KindFinished, NoteError, "reason=" + j.Reason}
	}
	d := "reason=" + j.Reason
	if code != "" {
		d += " " + code
	}
	if j.Reason == proto.ReasonLost && j.Error != "" {
		d += " (" + j.Error + ")"
	}
	return note{KindFinished, NoteAborted, d}
}
