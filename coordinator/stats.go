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
	Events      int64
	OutputBytes int64
	JobsLive    int
	Runners     int
}

// Stats returns a copy of the counters.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.JobsEnded = make(map[Status]int64, len(s.stats.JobsEnded))
	for k, v := range s.stats.JobsEnded {
		st.JobsEnded[k] = v
	}
	st.JobsLive = len(s.live)
	st.OutputStored = s.outputTotal
	st.Runners = len(s.runners)
	return st
}
