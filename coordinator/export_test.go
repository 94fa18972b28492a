package coordinator

// Observers is how many callers wait for the end of job id right now (a blocking start, a wait),
// so that a test can wait until its waiter is counted instead of sleeping.
func (s *Service) Observers(id string) int {
	return s.jobs.observers(id)
}
