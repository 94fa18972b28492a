package httpapi

import (
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/proto"
)

// jobView is the API's job object (API.md "Job object"). It is built from a coordinator.Job rather
// than serializing that, which carries internal fields (work_seq, accepted_at). Unset values are
// null, not absent: exit_code until the end, pid before the start, started_at, ended_at, usage.
type jobView struct {
	ID      string `json:"id"`
	Session string `json:"session"`
	Title   string `json:"title"`
	Command string `json:"command"`
	// Source is null for a command; {ws} for a job whose output is a WebSocket's messages.
	Source   *sourceView `json:"source"`
	Cwd      string      `json:"cwd"`
	Readonly bool        `json:"readonly"`
	User     string      `json:"user"`
	Shell    string      `json:"shell"`
	Linger   bool        `json:"linger"`
	Stdin    bool        `json:"stdin"`
	Pool     string      `json:"pool"`
	Status   string      `json:"status"`
	// QueuedReason says why a queued job has not started yet; null otherwise.
	QueuedReason *string    `json:"queued_reason"`
	Reason       string     `json:"reason"`
	ExitCode     *int       `json:"exit_code"`
	Pid          *int       `json:"pid"`
	Runner       string     `json:"runner"`
	CreatedAt    time.Time  `json:"created_at"`
	StartedAt    *time.Time `json:"started_at"`
	EndedAt      *time.Time `json:"ended_at"`
	ElapsedMS    int64      `json:"elapsed_ms"`
	OutputBytes  int64      `json:"output_bytes"`
	OutputPath   string     `json:"output_path"`
	Limits       limitsView `json:"limits"`
	Usage        *usageView `json:"usage"`
	// Timings are when the job passed each stage (docs/api.md "Timings").
	Timings timingsView `json:"timings"`
	Error   string      `json:"error,omitempty"`
	// NotifyOnOutput, Monitor and Persistent extend API.md's job object: what the start asked for.
	NotifyOnOutput *notifyView `json:"notify_on_output"`
	Monitor        bool        `json:"monitor"`
	Persistent     bool        `json:"persistent"`
	// ToolCallID is the start's tool_call_id (or tool_use_id), when it named one.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// LingerCgroup extends API.md's job object: the job lasts until its cgroup is empty.
	LingerCgroup bool `json:"linger_cgroup"`
	// TTY and TTYSize: the job runs on a terminal of that size (null without one); Ports are the
	// TCP addresses its processes listen on ([] when none).
	TTY     bool         `json:"tty"`
	TTYSize *ttySizeView `json:"tty_size"`
	Ports   []portView   `json:"ports"`
}

// ttySizeView is a terminal's size, in a start's body and in the job object.
type ttySizeView struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// portView is a TCP address a job listens on.
type portView struct {
	Address string `json:"address"`
	Port    int    `json:"port"`
}

// sourceView is a job's source, in a start's body and in the job object.
type sourceView struct {
	WS string `json:"ws"`
}

// notifyView is notify_on_output, in a start's body and in the job object.
type notifyView struct {
	Pattern    string `json:"pattern"`
	Reason     string `json:"reason"`
	DebounceMS int64  `json:"debounce_ms"`
}

// limitsView shows every limit, 0 meaning the runner's default, unlike proto.Limits which omits
// zeros on the wire.
type limitsView struct {
	MemoryBytes   int64 `json:"memory_bytes"`
	CPUMillicores int64 `json:"cpu_millicores"`
	Pids          int64 `json:"pids"`
	OutputBytes   int64 `json:"output_bytes"`
	TimeoutMS     int64 `json:"timeout_ms"`
}

type usageView struct {
	CPUMS           int64  `json:"cpu_ms"`
	MemoryPeakBytes uint64 `json:"memory_peak_bytes"`
}

// timingsView is coordinator.Timings with null for a stage not passed, where the store keeps 0.
type timingsView struct {
	StoredUS      *int64 `json:"stored_us"`
	PublishedUS   *int64 `json:"published_us"`
	TakenUS       *int64 `json:"taken_us"`
	CgroupUS      *int64 `json:"cgroup_us"`
	ExecUS        *int64 `json:"exec_us"`
	FirstOutputUS *int64 `json:"first_output_us"`
	ExitUS        *int64 `json:"exit_us"`
	ExitStoredUS  *int64 `json:"exit_stored_us"`
}

// stage is a stage's µs, nil when not passed (0).
func stage(us int64) *int64 {
	if us == 0 {
		return nil
	}
	return &us
}

func viewTimings(t coordinator.Timings) timingsView {
	return timingsView{
		StoredUS: stage(t.StoredUS), PublishedUS: stage(t.PublishedUS), TakenUS: stage(t.TakenUS),
		CgroupUS: stage(t.CgroupUS), ExecUS: stage(t.ExecUS), FirstOutputUS: stage(t.FirstOutputUS),
		ExitUS: stage(t.ExitUS), ExitStoredUS: stage(t.ExitStoredUS),
	}
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// viewJob builds the API's job object at time now.
func viewJob(j *coordinator.Job, now time.Time) *jobView {
	v := &jobView{
		ID: j.ID, Session: j.Session, Title: j.Title, Command: j.Command, Cwd: j.Cwd,
		Readonly: j.Readonly, User: j.User, Shell: j.Shell, Linger: j.Linger, Stdin: j.Stdin, Pool: j.Pool, Status: string(j.Status), Reason: j.Reason,
		Runner: j.Runner, CreatedAt: j.CreatedAt.UTC(), StartedAt: utc(j.StartedAt),
		EndedAt: utc(j.EndedAt), ElapsedMS: j.ElapsedMS(now), OutputBytes: j.OutputBytes,
		OutputPath: j.OutputPath, Error: j.Error, Timings: viewTimings(j.Timings),
		Limits: limitsView{
			MemoryBytes: j.Limits.MemoryBytes, CPUMillicores: j.Limits.CPUMillicores,
			Pids: j.Limits.Pids, OutputBytes: j.Limits.OutputBytes, TimeoutMS: j.Limits.TimeoutMS,
		},
	}
	if j.ExitCode != nil {
		c := *j.ExitCode
		v.ExitCode = &c
	}
	if j.Source != nil {
		v.Source = &sourceView{WS: j.Source.WS}
	}
	if j.Pid != 0 {
		p := j.Pid
		v.Pid = &p
	}
	if j.QueuedReason != "" {
		r := j.QueuedReason
		v.QueuedReason = &r
	}
	if j.Usage != nil {
		v.Usage = &usageView{CPUMS: j.Usage.CPUMS, MemoryPeakBytes: j.Usage.MemoryPeakBytes}
	}
	if n := j.Notify; n != nil {
		v.NotifyOnOutput = &notifyView{Pattern: n.Pattern, Reason: n.Reason, DebounceMS: n.DebounceMS}
	}
	v.Monitor, v.Persistent, v.ToolCallID, v.LingerCgroup = j.Monitor, j.Persistent, j.ToolCallID, j.LingerCgroup
	v.TTY, v.Ports = j.TTY, make([]portView, 0, len(j.Ports))
	if j.TTY {
		v.TTYSize = &ttySizeView{Rows: proto.DefaultTTYRows, Cols: proto.DefaultTTYCols}
		if j.TTYSize != nil {
			v.TTYSize = &ttySizeView{Rows: j.TTYSize.Rows, Cols: j.TTYSize.Cols}
		}
	}
	for _, p := range j.Ports {
		v.Ports = append(v.Ports, portView{Address: p.Address, Port: p.Port})
	}
	return v
}

// notificationView is the API's notification object (API.md "Notification object").
type notificationView struct {
	Seq        uint64    `json:"seq"`
	ID         string    `json:"id"`
	Session    string    `json:"session"`
	Kind       string    `json:"kind"`
	Status     string    `json:"status"`
	JobID      string    `json:"job_id"`
	Title      string    `json:"title"`
	Detail     string    `json:"detail"`
	OutputPath string    `json:"output_path"`
	CreatedAt  time.Time `json:"created_at"`
	// Format extends API.md's object: the format text is written in.
	Format string `json:"format"`
	Text   string `json:"text"`
	// ToolCallID extends API.md's object: the tool call that started the job, when its start named one.
	ToolCallID string `json:"tool_call_id,omitempty"`
}

func viewNotification(n *coordinator.Notification) *notificationView {
	return &notificationView{
		Seq: n.Seq, ID: n.ID, Session: n.Session, Kind: string(n.Kind), Status: n.Status, JobID: n.JobID,
		Title: n.Title, Detail: n.Detail, OutputPath: n.OutputPath, CreatedAt: n.CreatedAt.UTC(),
		Format: string(formatOf(n.Format)), Text: n.Text, ToolCallID: n.ToolCallID,
	}
}

// formatOf names the default format rather than leave it blank.
func formatOf(f coordinator.Format) coordinator.Format {
	if f == "" {
		return coordinator.FormatSystem
	}
	return f
}

// sessionView is the API's session object.
type sessionView struct {
	ID        string     `json:"id"`
	CreatedAt time.Time  `json:"created_at"`
	LeaseMS   int64      `json:"lease_ms"`
	ExpiresAt *time.Time `json:"expires_at"`
	EndedAt   *time.Time `json:"ended_at"`
	Acked     uint64     `json:"acked"`
	LastSeq   uint64     `json:"last_seq"`
	// Format is the format of the session's notifications.
	Format string `json:"format"`
}

func viewSession(s *coordinator.Session) *sessionView {
	return &sessionView{
		ID: s.ID, CreatedAt: s.CreatedAt.UTC(), LeaseMS: s.LeaseMS, ExpiresAt: utc(s.ExpiresAt),
		EndedAt: utc(s.EndedAt), Acked: s.Acked, LastSeq: s.LastSeq, Format: string(formatOf(s.Format)),
	}
}

// runnerView is one element of GET /v1/runners.
type runnerView struct {
	ID             string            `json:"id"`
	Pool           string            `json:"pool"`
	Slots          int               `json:"slots"`
	Running        int               `json:"running"`
	Readonly       bool              `json:"readonly"`
	ReadonlyReason string            `json:"readonly_reason"`
	Cgroup         string            `json:"cgroup"`
	Labels         map[string]string `json:"labels"`
	LastSeen       time.Time         `json:"last_seen"`
	Version        string            `json:"version"`
	// Draining: the runner was told to stop; it takes no work and lets its jobs finish.
	Draining bool `json:"draining"`
}

func viewRunner(r coordinator.Runner) runnerView {
	labels := r.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	return runnerView{
		ID: r.ID, Pool: r.Pool, Slots: r.Slots, Running: r.Running, Readonly: r.Readonly,
		ReadonlyReason: r.ReadonlyReason, Cgroup: r.Cgroup, Labels: labels,
		LastSeen: r.LastSeen.UTC(), Version: r.Version, Draining: r.Draining,
	}
}
