// Package coordinatortest helps the tests of the coordinator and of its adapters play a runner's
// part against a real *coordinator.Service. The NATS servers they run are internal/natstest's.
package coordinatortest

import (
	"context"

	"github.com/sbx-dev/sbx/coordinator"
)

// Claimed fills in the claim of e's job, as its runner would: it learnt it from the work.
func Claimed(svc *coordinator.Service, e *coordinator.Event) *coordinator.Event {
	if j, err := svc.Job(context.Background(), e.JobID); err == nil {
		e.Claim = j.Claim
	}
	return e
}

// ClaimedChunk fills in the claim of c's job and, when unset, runner r1, as a runner's chunk has them.
func ClaimedChunk(svc *coordinator.Service, c *coordinator.Chunk) *coordinator.Chunk {
	if j, err := svc.Job(context.Background(), c.JobID); err == nil {
		c.Claim = j.Claim
	}
	if c.Runner == "" {
		c.Runner = "r1"
	}
	return c
}
