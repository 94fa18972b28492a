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
)

// Statuses of a notification.
const (
	NoteSuccess = "success"
	NoteError   = "error"
	NoteAborted = "aborted"
)

// Notification is one thing an agent is told about a job. Seq is strictly increasing within its
// session; ID is unique, and the same for a notification stored twice (a redelivered event).
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
	Text       string           `json:"text"`
}

// Render returns the notification in the agent-tool <system_notification> format of API.md, which a
// harness can put into a model's context as it is. It has no trailing newline.
func Render(n *Notification) string {
	verb := "has notified"
	if n.Kind == KindFinished {
		verb = "has finished"
	}
	var b strings.Builder
	b.WriteString("<system_notification>\nThe following task ")
	b.WriteString(verb)
	b.WriteString(". If you were already aware, ignore this notification and do not restate prior responses.\n\n<task>\nkind: shell\n")
	b.WriteString("status: " + n.Status + "\n")
	b.WriteString("task_id: " + n.JobID + "\n")
	b.WriteString("title: " + oneLine(n.Title) + "\n")
	b.WriteString("tool_call_id: " + n.JobID + "\n")
	if n.Detail != "" {
		b.WriteString("detail: " + n.Detail + "\n")
	}
	if n.OutputPath != "" {
		b.WriteString("output_path: " + n.OutputPath + "\n")
	}
	b.WriteString("</task>\n</system_notification>\nBriefly inform the user about the task result and perform any follow-up actions (if needed).")
	return b.String()
}

// oneLine keeps a field on its line of the rendering.
func oneLine(s string) string {
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
}
