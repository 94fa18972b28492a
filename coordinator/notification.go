package coordinator

import (
	"strings"
	"time"
)

// NotificationKind says what a notification is about.
type NotificationKind string

// Kinds of notification (see docs/notifications.md).
const (
	// KindFinished: the job ended. Exactly one per job, unless its end was observed.
	KindFinished NotificationKind = "finished"
	// KindOutput: a line of output matched the job's notify_on_output pattern.
	KindOutput NotificationKind = "output"
	// KindStall: the output stopped growing and its last line looks like a prompt.
	KindStall NotificationKind = "stall"
	// KindLimit: something was cut off: the output notifications of a job, or a monitor.
	KindLimit NotificationKind = "limit"
	// KindMonitor: lines of a monitor job's output.
	KindMonitor NotificationKind = "monitor"
	// KindPort: the job began to listen on a TCP port.
	KindPort NotificationKind = "port"
)

// Statuses of a notification.
const (
	NoteSuccess = "success"
	NoteError   = "error"
	NoteAborted = "aborted"
)

// Format is how a notification's text is written.
type Format string

// Formats of a notification's text (see docs/notifications.md).
const (
	// FormatSystem is the agent-tool <system_notification> format of docs/api.md, as Cursor writes it.
	FormatSystem Format = "system_notification"
	// FormatTask is Claude Code's <task-notification> format.
	FormatTask Format = "task_notification"
)

// ParseFormat checks a format named by the request field `field`; "" stays "" (the default applies).
func ParseFormat(field, s string) (Format, error) {
	switch f := Format(s); f {
	case "", FormatSystem, FormatTask:
		return f, nil
	}
	return "", Errorf(EINVALID, "%s %q is not one of %s, %s.", field, s, FormatSystem, FormatTask)
}

// Notification is one thing an agent is told about a job. Seq is strictly increasing within its
// session; ID is unique, and the same for a notification stored twice (a redelivered event).
//
// Title and Detail are what the <system_notification> form says, Summary and Event what the
// <task-notification> form says; both are kept, so a stored notification renders in either format.
// They hold what came from the job as it is; the renderings escape it.
type Notification struct {
	Seq        uint64           `json:"seq"`
	ID         string           `json:"id"`
	Session    string           `json:"session"`
	Kind       NotificationKind `json:"kind"`
	Status     string           `json:"status"`
	JobID      string           `json:"job_id"`
	Title      string           `json:"title"`
	Detail     string           `json:"detail"`
	OutputPath string           `json:"output_path"`
	CreatedAt  time.Time        `json:"created_at"`
	Summary    string           `json:"summary,omitempty"`
	Event      string           `json:"event,omitempty"`
	// ToolCallID is the tool call that started the job, as its start named it ("": none).
	ToolCallID string `json:"tool_call_id,omitempty"`
	// Advice is what a stall's <task-notification> form ends with ("": stallAdvice).
	Advice string `json:"advice,omitempty"`
	// Format is the format Text is written in.
	Format Format `json:"format,omitempty"`
	Text   string `json:"text"`
}

// RenderAs returns the notification's text in format f ("" is FormatSystem).
func RenderAs(n *Notification, f Format) string {
	if f == FormatTask {
		return RenderTask(n)
	}
	return Render(n)
}

// Render returns the notification in the agent-tool <system_notification> format of docs/api.md, which a
// harness can put into a model's context as it is. It has no trailing newline. What came from the
// job is escaped (&, <, >), so that output cannot close the frame or open one, and the lines of a
// multi-line value after its first are indented, so that none reads as a field of the task.
//
// A job's end is written as the background shell tool writes it: a detail only for an error (the
// exit code), no output_path; an abort's reason stays in the notification's JSON fields.
// tool_call_id is the start's tool call, else the job's id.
func Render(n *Notification) string {
	verb := "has notified"
	if n.Kind == KindFinished {
		verb = "has finished"
	}
	toolCall := n.ToolCallID
	if toolCall == "" {
		toolCall = n.JobID
	}
	var b strings.Builder
	b.WriteString("<system_notification>\nThe following task ")
	b.WriteString(verb)
	b.WriteString(". If you were already aware, ignore this notification and do not restate prior responses.\n\n<task>\nkind: shell\n")
	b.WriteString("status: " + n.Status + "\n")
	b.WriteString("task_id: " + escape(n.JobID) + "\n")
	b.WriteString("title: " + escape(oneLine(n.Title)) + "\n")
	b.WriteString("tool_call_id: " + escape(oneLine(toolCall)) + "\n")
	if n.Detail != "" && (n.Kind != KindFinished || n.Status == NoteError) {
		b.WriteString("detail: " + indent(escape(n.Detail)) + "\n")
	}
	if n.OutputPath != "" && n.Kind != KindFinished {
		b.WriteString("output_path: " + escape(n.OutputPath) + "\n")
	}
	b.WriteString("</task>\n</system_notification>\nBriefly inform the user about the task result and perform any follow-up actions (if needed).")
	return b.String()
}

// stallAdvice ends a stall notification in the <task-notification> form, as Claude Code's does.
const stallAdvice = "The command is likely blocked on an interactive prompt. Kill this task and re-run with piped input (e.g., `echo y | command`) or a non-interactive flag if one exists."

// RenderTask returns the notification in Claude Code's <task-notification> format, element for
// element as the async-bash tool builds it: task_id, tool_use_id (only when the start named a tool
// call), output_file, status (for an end only: completed, failed or killed; none for a stall) and
// summary; then <event> for a watcher's event (an output match, monitor lines), which the element
// carries in Claude Code's Monitor. After it a stall adds the last output and what to do. It has no
// trailing newline and escapes what came from the job (&, <, >).
func RenderTask(n *Notification) string {
	var b strings.Builder
	b.WriteString("<task-notification>\n<task_id>" + escape(n.JobID) + "</task_id>\n")
	if n.ToolCallID != "" {
		b.WriteString("<tool_use_id>" + escape(oneLine(n.ToolCallID)) + "</tool_use_id>\n")
	}
	b.WriteString("<output_file>" + escape(n.OutputPath) + "</output_file>\n")
	if isEnd(n) {
		b.WriteString("<status>" + taskStatus(n.Status) + "</status>\n")
	}
	b.WriteString("<summary>" + escape(oneLine(n.Summary)) + "</summary>\n")
	if n.Event != "" && n.Kind != KindStall && !isEnd(n) {
		b.WriteString("<event>" + escape(n.Event) + "</event>\n")
	}
	b.WriteString("</task-notification>")
	if n.Kind == KindStall {
		advice := stallAdvice
		if n.Advice != "" {
			advice = escape(n.Advice)
		}
		b.WriteString("\nLast output:\n" + escape(n.Event) + "\n\n" + advice)
	}
	return b.String()
}

// isEnd reports whether a notification is a job's last word: its end, or a monitor's stop (which
// the finished notification of the killed job does not follow).
func isEnd(n *Notification) bool {
	return n.Kind == KindFinished || n.Kind == KindLimit && n.Status == NoteAborted
}

// taskStatus is the <task-notification> status of a job's end.
func taskStatus(status string) string {
	switch status {
	case NoteSuccess:
		return "completed"
	case NoteError:
		return "failed"
	}
	return "killed"
}

// escaper keeps a value from being read as markup: no text from a job can close a frame or open one.
var escaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

func escape(s string) string { return escaper.Replace(s) }

// indent indents the lines of s after its first, but blank ones, by two spaces.
func indent(s string) string {
	lines := strings.Split(s, "\n")
	for i := 1; i < len(lines); i++ {
		if lines[i] != "" {
			lines[i] = "  " + lines[i]
		}
	}
	return strings.Join(lines, "\n")
}

// oneLine keeps a field on its line of the rendering.
func oneLine(s string) string {
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
}
