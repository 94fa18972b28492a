package coordinator

// Stats are the coordinator's counters since it started, for /metrics.
type Stats struct {
	JobsStarted int64
	JobsEnded   map[Status]int64
	// JobsRemoved and NotificationsRemoved count what retention removed; OutputStored is the output of
	// the ended jobs kept.
	JobsRemoved          int64
	NotificationsRemoved int64
	OutputStored         int64
	Events               int64
	OutputBytes          int64
	JobsLive             int
	Runners              int
	// Forged counts the runner messages dropped as forged, by kind (ForgedKinds).
	Forged map[string]int64
	// ScannedBytes counts the output read to match waits' patterns.
	ScannedBytes int64
	// OutputLive is the output of the jobs not ended; with OutputStored, held to the output budget.
	OutputLive int64
}

// Kinds of forged messages, for Stats.Forged.
const (
	ForgedState     = "state"
	ForgedOutput    = "output"
	ForgedHeartbeat = "heartbeat"
)

// ForgedKinds lists the kinds of Stats.Forged, so that /metrics shows each from the start.
var ForgedKinds = []string{ForgedState, ForgedOutput, ForgedHeartbeat}

// Stats returns a copy of the counters.
func (s *Service) Stats() Stats {
	var st Stats
	s.jobs.fillStats(&st)
	st.OutputStored, st.OutputLive, st.JobsRemoved, st.NotificationsRemoved = s.budget.counts()
	st.Runners = s.fleet.count()
	st.ScannedBytes = s.scannedBytes.Load()
	return st
}
