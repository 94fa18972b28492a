package httpapi

import (
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/api"
	"github.com/sbx-dev/sbx/proto"
)

// stage is a stage's µs, nil when not passed (0).
func stage(us int64) *int64 {
	if us == 0 {
		return nil
	}
	return &us
}

// viewTimings is t with null for a stage not passed, where the store keeps 0.
func viewTimings(t coordinator.Timings) api.Timings {
	return api.Timings{
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

// viewJob builds the API's job object at time now. It is built from a coordinator.Job rather than
// serializing that, which carries internal fields (work_seq, accepted_at); every limit is shown, 0
// meaning the runner's default, unlike proto.Limits which omits zeros on the wire.
func viewJob(j *coordinator.Job, now time.Time) api.Job {
	v := api.Job{
		ID: j.ID, Session: j.Session, Title: j.Title, Command: j.Command, Cwd: j.Cwd,
		Readonly: j.Readonly, User: j.User, Shell: j.Shell, Linger: j.Linger, Stdin: j.Stdin, Pool: j.Pool, Status: string(j.Status), Reason: j.Reason,
		Runner: j.Runner, CreatedAt: j.CreatedAt.UTC(), StartedAt: utc(j.StartedAt),
		EndedAt: utc(j.EndedAt), ElapsedMS: j.ElapsedMS(now), OutputBytes: j.OutputBytes,
		OutputPath: j.OutputPath, Error: j.Error, Timings: viewTimings(j.Timings),
		Limits: api.Limits{
			MemoryBytes: j.Limits.MemoryBytes, CPUMillicores: j.Limits.CPUMillicores,
			Pids: j.Limits.Pids, OutputBytes: j.Limits.OutputBytes, TimeoutMS: j.Limits.TimeoutMS,
		},
	}
	if j.ExitCode != nil {
		c := *j.ExitCode
		v.ExitCode = &c
	}
	if j.Source != nil {
		v.Source = &api.Source{WS: j.Source.WS}
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
		v.Usage = &api.Usage{CPUMS: j.Usage.CPUMS, MemoryPeakBytes: j.Usage.MemoryPeakBytes}
	}
	if n := j.Notify; n != nil {
		v.NotifyOnOutput = &api.NotifyOnOutput{Pattern: n.Pattern, Reason: n.Reason, DebounceMS: n.DebounceMS}
	}
	v.Monitor, v.Persistent, v.ToolCallID, v.LingerCgroup = j.Monitor, j.Persistent, j.ToolCallID, j.LingerCgroup
	v.TTY, v.Ports = j.TTY, make([]api.Port, 0, len(j.Ports))
	if j.TTY {
		v.TTYSize = &api.TTYSize{Rows: proto.DefaultTTYRows, Cols: proto.DefaultTTYCols}
		if j.TTYSize != nil {
			v.TTYSize = &api.TTYSize{Rows: j.TTYSize.Rows, Cols: j.TTYSize.Cols}
		}
	}
	for _, p := range j.Ports {
		v.Ports = append(v.Ports, api.Port{Address: p.Address, Port: p.Port})
	}
	return v
}

// viewNotification builds the API's notification object.
func viewNotification(n *coordinator.Notification) api.Notification {
	return api.Notification{
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

// viewSession builds the API's session object.
func viewSession(s *coordinator.Session) api.Session {
	return api.Session{
		ID: s.ID, CreatedAt: s.CreatedAt.UTC(), LeaseMS: s.LeaseMS, ExpiresAt: utc(s.ExpiresAt),
		EndedAt: utc(s.EndedAt), Acked: s.Acked, LastSeq: s.LastSeq, Format: string(formatOf(s.Format)),
	}
}

// viewRunner builds one element of the runners' listing.
func viewRunner(r coordinator.Runner) api.Runner {
	labels := r.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	return api.Runner{
		ID: r.ID, Pool: r.Pool, Slots: r.Slots, Running: r.Running, Readonly: r.Readonly,
		ReadonlyReason: r.ReadonlyReason, Cgroup: r.Cgroup, Labels: labels,
		LastSeen: r.LastSeen.UTC(), Version: r.Version, Draining: r.Draining,
	}
}
