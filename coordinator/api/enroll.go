package api

// EnrollRequest is the body of POST /v1/enroll, by which a runner holding the enroll key gets NATS
// creds for its id.
type EnrollRequest struct {
	RunnerID string `json:"runner_id"`
	// Pool, when set, limits the creds to that pool's work.
	Pool string `json:"pool,omitempty"`
}

// EnrollReply is the reply to POST /v1/enroll.
type EnrollReply struct {
	RunnerID string `json:"runner_id"`
	// Creds is a NATS credentials file for the runner.
	Creds string `json:"creds"`
}
