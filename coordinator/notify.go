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
	// MaxNotifyPattern bounds notify_on_output's pattern, in characters; MaxNotifyReason is where a
	// longer reason (the notifications' title) is cut, with "...", as the seed tools cut it.
	MaxNotifyPattern = 500
	MaxNotifyReason  = 500
	// DefaultDebounce is the debounce window when the request sets none; it is also the minimum: a
	// shorter one is raised to it, as the seed tools raise it.
	DefaultDebounce = 5 * time.Second
	// MaxDebounce bounds the debounce window; a longer one is lowered to it.
	MaxDebounce = time.Hour
	// MaxMatches is how many matches of a job are notified; the last one sends the limit notice too.
	MaxMatches = 100
	// MaxMatchText is the longest matched text (or monitor line) a notification quotes; a longer one
	// is named by its length.
	MaxMatchText = 5000
	// maxLine is the longest partial line held; a longer one is handled as a line of its own.
	maxLine = 64 << 10
	// matchChunk is the most output matched at once, and matchCarry how many characters of the
	// output before it are matched with it, so that a match can span lines and chunks: pi-pstack's
	// output watch (pi.15) matches its stream so.
	matchChunk = 64 << 10
	matchCarry = 1024
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
	o.Reason = cutTitle(strings.TrimSpace(o.Reason))
	if o.DebounceMS < 0 {
		return Errorf(EINVALID, "notify_on_output.debounce_ms must not be negative.")
	}
	o.DebounceMS = min(max(o.DebounceMS, minDebounce.Milliseconds()), MaxDebounce.Milliseconds())
	return nil
}

// note is a notification not yet stored: the service fills in the job's fields and the seq. title
// "" is the job's title; summary and event are what its <task-notification> form says.
type note struct {
	kind    NotificationKind
	status  string
	title   string
	detail  string
	summary string
	event   string
	advice  string // a stall's own advice ("": stallAdvice)
}

// outputWatch follows one job's output: it matches notify_on_output's pattern over the stream,
// debouncing, and collects a monitor's lines. It sees only the gap-free body, in order. Its owner
// holds lc.mu (lifecycle).
type outputWatch struct {
	jobTitle string
	re       *regexp.Regexp
	pattern  string
	title    string // the title of the job's output notifications: the reason
	debounce time.Duration
	// partial holds stdout's unfinished last line, for a monitor's events.
	partial []byte
	// held is each stream's output not matched yet: its unfinished last line (a match waits for the
	// line's end, so that `Local:.*` quotes the whole line); carry the last matchCarry characters
	// of what each stream matched, which the next chunk is matched with.
	held  [2][]byte
	carry [2]string

	matches   int       // matches so far
	windowEnd time.Time // end of the debounce window; zero when none is open
	pending   int       // matches inside the window not yet notified
	latest    string    // the text of the latest pending match
	latestN   int       // its occurrence number
	limited   bool      // the limit notice was sent: nothing more

	monitor      bool
	monMax       int
	monWindow    time.Duration
	monStart     time.Time
	monCount     int
	monLines     []string
	monStopped   bool // the monitor went over its rate: it is being stopped, and that was its last word
	monKillAsked bool
	// tty: the lines are a terminal's, matched and quoted without escape sequences.
	tty bool

	notes []note
}

// newOutputWatch returns the watch of a job, or nil when nothing watches its output.
func newOutputWatch(j *Job, cfg *Config) *outputWatch {
	if j.Notify == nil && !j.Monitor {
		return nil
	}
	w := &outputWatch{jobTitle: j.Title, monitor: j.Monitor, monMax: cfg.MonitorMaxLines, monWindow: cfg.MonitorWindow, tty: j.TTY}
	if j.Notify != nil {
		// The pattern was checked at the start; a stored one that no longer compiles watches nothing.
		// Multiline, as the seed compiles it: ^ and $ match at line boundaries.
		re, err := regexp.Compile("(?m:" + j.Notify.Pattern + ")")
		if err == nil {
			w.re, w.pattern = re, j.Notify.Pattern
			w.title = matchTitle(j.Notify)
			w.debounce = time.Duration(j.Notify.DebounceMS) * time.Millisecond
		}
	}
	return w
}

// matchTitle is the title of a job's output notifications: the reason (cut at the start), else a
// sentence naming the pattern, cut the same way.
func matchTitle(n *OutputNotify) string {
	if t := strings.TrimSpace(n.Reason); t != "" {
		return t
	}
	return cutTitle("Shell output contains /" + n.Pattern + "/")
}

// cutTitle cuts a title longer than MaxNotifyReason characters there, with "...", as Cursor does.
func cutTitle(t string) string {
	if r := []rune(t); len(r) > MaxNotifyReason {
		return string(r[:MaxNotifyReason]) + "..."
	}
	return t
}

// feed takes newly contiguous output bytes of one stream: stdout (or both interleaved), or the
// stderr of a job that reads it apart. A monitor's events are stdout lines only, as Claude Code's
// Monitor's are; notify_on_output matches the lines of both.
func (w *outputWatch) feed(p []byte, stderr bool, now time.Time) {
	s := 0
	if stderr {
		s = 1
	}
	if w.monitor && !stderr {
		w.lines(p, now)
	}
	w.scan(s, p, false, now)
	w.flushMonitor()
}

// lines splits stdout's bytes into a monitor's lines.
func (w *outputWatch) lines(p []byte, now time.Time) {
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
}

// scan matches the pattern over a stream: the bytes up to the last newline held and given, in
// chunks of at most matchChunk bytes, each with the carry of what came before it. A match counts
// once: when it ends in the new chunk. final matches what is held, the job having ended.
func (w *outputWatch) scan(s int, p []byte, final bool, now time.Time) {
	if w.re == nil {
		return
	}
	w.held[s] = append(w.held[s], p...)
	n := bytes.LastIndexByte(w.held[s], '\n') + 1
	if final || len(w.held[s])-n >= maxLine {
		n = len(w.held[s])
	}
	ready := w.held[s][:n]
	if w.tty {
		// A terminal's output is matched as its text: a pattern does not see colours or cursor moves
		// (the held rest starts on a line, where escape sequences seldom straddle).
		ready = StripANSI(ready)
	}
	for len(ready) > 0 && !w.limited && !w.monStopped {
		k := min(len(ready), matchChunk)
		for k < len(ready) && !utf8.RuneStart(ready[k]) {
			k-- // a chunk ends at a character's end
		}
		if k == 0 {
			k = min(len(ready), matchChunk)
		}
		text := w.carry[s] + strings.ReplaceAll(string(ready[:k]), "\r\n", "\n")
		for _, loc := range w.re.FindAllStringIndex(text, -1) {
			if loc[1] > len(w.carry[s]) && !w.limited {
				w.match(text[loc[0]:loc[1]], now)
			}
		}
		w.carry[s] = lastRunes(text, matchCarry)
		ready = ready[k:]
	}
	w.held[s] = append(w.held[s][:0], w.held[s][n:]...)
}

// lastRunes is the end of s, at most n characters.
func lastRunes(s string, n int) string {
	i := len(s)
	for ; i > 0 && n > 0; n-- {
		_, size := utf8.DecodeLastRuneInString(s[:i])
		i -= size
	}
	return s[i:]
}

// end handles the held partial lines and flushes what is pending: the job ended.
func (w *outputWatch) end(now time.Time) {
	if len(w.partial) > 0 {
		w.line(strings.TrimRight(string(w.partial), "\r"), now)
		w.partial = nil
	}
	for s := range w.held {
		w.scan(s, nil, true, now)
	}
	w.flushMonitor()
	w.flushMatches()
}

// tick closes the debounce window when its time has come, sending what it counted.
func (w *outputWatch) tick(now time.Time) {
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

// line takes one of a monitor's lines.
func (w *outputWatch) line(line string, now time.Time) {
	if w.tty {
		line = strings.TrimRight(string(StripANSI([]byte(line))), "\r")
	}
	if w.monStopped {
		return // the stop notice was the monitor's last word
	}
	if w.monStart.IsZero() || now.Sub(w.monStart) >= w.monWindow {
		w.monStart, w.monCount = now, 0
	}
	w.monCount++
	if w.monCount > w.monMax {
		w.flushMonitor()
		w.flushMatches()
		w.monStopped = true
		stop := fmt.Sprintf("[Monitor stopped — too much output (more than %d lines in %s). Restart with a more selective source.]", w.monMax, w.monWindow)
		// The <task-notification> is the async-bash tool's terminal notice of a firehose.
		summary := fmt.Sprintf(`Monitor "%s" stopped (too many events (>%d/%ss) — restart with a tighter filter)`,
			w.jobTitle, w.monMax, strconv.FormatFloat(w.monWindow.Seconds(), 'f', -1, 64))
		w.notes = append(w.notes, note{kind: KindLimit, status: NoteAborted, detail: stop, summary: summary})
		return
	}
	w.monLines = append(w.monLines, describe(line, "line"))
}

// match takes one match of the pattern, with the text it matched.
func (w *outputWatch) match(text string, now time.Time) {
	w.tick(now)
	w.matches++
	if w.windowEnd.IsZero() {
		w.notes = append(w.notes, w.matchNote(1, w.matches, text))
		w.windowEnd = now.Add(w.debounce)
	} else {
		w.pending++
		w.latest, w.latestN = text, w.matches
	}
	if w.matches == MaxMatches {
		// As Cursor does: the limit notice comes with the last match notified, not after it.
		w.flushMatches()
		w.limited = true
		d := fmt.Sprintf("Shell output matched /%s/ %d times and has reached the notification limit. No further notifications will be sent for this pattern. To continue monitoring, read the output file directly at the output path.", w.pattern, MaxMatches)
		w.notes = append(w.notes, note{
			kind: KindLimit, status: NoteSuccess, title: fmt.Sprintf("Notification limit reached (%d)", MaxMatches),
			detail: d, summary: monitorEvent(w.title), event: d,
		})
	}
}

// matchNote is the output notification of count matches, the latest being occurrence number n with
// the matched text; its sentences are Cursor's.
func (w *outputWatch) matchNote(count, n int, text string) note {
	label := "Latest match"
	if n == 1 {
		label = "Matched text"
	}
	matched := label + ": " + text + "."
	if c := utf8.RuneCountInString(text); c > MaxMatchText {
		matched = fmt.Sprintf("%s is %d characters; omitted from notification detail.", label, c)
	}
	var d string
	if count == 1 {
		d = fmt.Sprintf("Shell output has pattern /%s/. This is occurrence number %d. %s The title message is being displayed to the user.", w.pattern, n, matched)
	} else {
		d = fmt.Sprintf("Shell output matched /%s/ %d more times since the previous notification. The title message is being displayed to the user. %s", w.pattern, count, matched)
	}
	return note{kind: KindOutput, status: NoteSuccess, title: w.title, detail: d, summary: monitorEvent(w.title), event: d}
}

func (w *outputWatch) flushMatches() {
	if w.pending == 0 {
		return
	}
	w.notes = append(w.notes, w.matchNote(w.pending, w.latestN, w.latest))
	w.pending, w.latest = 0, ""
}

func (w *outputWatch) flushMonitor() {
	if len(w.monLines) == 0 {
		return
	}
	lines := strings.Join(w.monLines, "\n")
	w.notes = append(w.notes, note{kind: KindMonitor, status: NoteSuccess, detail: lines, summary: monitorEvent(w.jobTitle), event: lines})
	w.monLines = nil
}

// take returns the notes collected since the last call.
func (w *outputWatch) take() []note {
	n := w.notes
	w.notes = nil
	return n
}

// monitorEvent is the <task-notification> summary of a watcher's event, as Claude Code's Monitor
// writes it.
func monitorEvent(title string) string {
	return `Monitor event: "` + title + `"`
}

// describe quotes a line, or names it by its length when it is longer than MaxMatchText characters.
func describe(s, what string) string {
	if n := utf8.RuneCountInString(s); n > MaxMatchText {
		return fmt.Sprintf("(a %s of %d characters)", what, n)
	}
	return s
}

// promptRE recognises a last line that waits for an answer: Claude Code's patterns, and a few more.
var promptRE = regexp.MustCompile(`(?i)\(y/n\)|\[y/n\]|\(yes/no\)|\[yes/no\]|press (?:enter|any key)|continue\?|overwrite\?|\b(?:do you|would you|shall i|are you sure|ready to)\b.*\? *$|password:|passphrase.*:`)

// stallNote returns the stall notification of a job whose output's tail ends with a line that
// looks like a prompt.
func stallNote(j *Job, tail []byte, quiet time.Duration) (note, bool) {
	text := strings.ReplaceAll(string(tail), "\r", "")
	text = strings.TrimRight(text, " \t\n")
	lines := strings.Split(text, "\n")
	if !promptRE.MatchString(lines[len(lines)-1]) {
		return note{}, false
	}
	if len(lines) > stallTail {
		lines = lines[len(lines)-stallTail:]
	}
	for i, l := range lines {
		lines[i] = describe(l, "line")
	}
	last := strings.Join(lines, "\n")
	return note{
		kind: KindStall, status: NoteError,
		detail: fmt.Sprintf("The command appears to be waiting for interactive input: no output for %s, and its last line looks like a prompt. Last output:\n%s\n\n%s",
			quiet.Round(time.Second), last, stallAdvice),
		summary: `Async command "` + j.Title + `" appears to be waiting for interactive input`,
		event:   last,
	}, true
}

// finishedNote is the finished notification of an ended job. A success has no detail, a failure
// its exit code, an abort its reason (and the signal, and why, when known); the <system_notification>
// shows the detail of a failure only. The summary is the async-bash tool's sentence, and a failed
// start (which it has no case for: it reports exit code 127) says why.
func finishedNote(j *Job) note {
	subject := `Async command "` + j.Title + `"`
	if j.Monitor {
		subject = `Monitor "` + j.Title + `"`
	}
	switch {
	case j.Status == StatusSucceeded:
		n := note{kind: KindFinished, status: NoteSuccess, summary: subject + " completed (exit code 0)"}
		if j.Monitor {
			n.summary = subject + " stream ended"
		}
		return n
	case j.Status == StatusFailed && j.ExitCode != nil:
		code := strconv.Itoa(*j.ExitCode)
		n := note{kind: KindFinished, status: NoteError, detail: "exit_code=" + code, summary: subject + " failed with exit code " + code}
		if j.Monitor {
			n.summary = subject + " script failed (exit " + code + ")"
		}
		return n
	case j.Status == StatusFailed:
		n := note{kind: KindFinished, status: NoteError, detail: "reason=" + j.Reason, summary: subject + " failed to start"}
		if j.Error != "" {
			n.detail += " (" + j.Error + ")"
			n.summary += " (" + j.Error + ")"
		}
		return n
	}
	d := "reason=" + j.Reason
	if j.Reason == proto.ReasonSignal {
		d += " signal=" + signalName(j.Signal)
	}
	if j.Error != "" {
		d += " (" + j.Error + ")"
	}
	n := note{kind: KindFinished, status: NoteAborted, detail: d, summary: subject + " was stopped"}
	if j.Monitor {
		n.summary = subject + " stopped"
		if j.Reason == proto.ReasonTimeout && j.Limits.TimeoutMS > 0 {
			n.summary += fmt.Sprintf(" (timeout after %ds)", (j.Limits.TimeoutMS+500)/1000)
		}
	}
	return n
}

// signalName names a Linux signal by its number (SIGSEGV), or by the number when it has no name.
func signalName(n int) string {
	names := [...]string{"", "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "BUS", "FPE", "KILL", "USR1", "SEGV",
		"USR2", "PIPE", "ALRM", "TERM", "STKFLT", "CHLD", "CONT", "STOP", "TSTP", "TTIN", "TTOU", "URG", "XCPU",
		"XFSZ", "VTALRM", "PROF", "WINCH", "IO", "PWR", "SYS"}
	if n > 0 && n < len(names) {
		return "SIG" + names[n]
	}
	return strconv.Itoa(n)
}
