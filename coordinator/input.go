package coordinator

import (
	"context"
	"time"

	"github.com/sbx-dev/sbx/proto"
)

// inputStartWait is how long Input waits for a job that is about to start: an agent often sends
// input right after it started the job.
const inputStartWait = 5 * time.Second

// Input writes data to a running job's standard input, then closes it when closeIt is set. The job
// must have been started with stdin; a queued one is waited for a few seconds.
func (s *Service) Input(ctx context.Context, id string, data []byte, closeIt bool) error {
	if len(data) > proto.MaxStdinBytes {
		return Errorf(ETOOLARGE, "data is %d bytes; one call sends at most %d.", len(data), proto.MaxStdinBytes)
	}
	runner, err := s.runnerOf(ctx, id, func(j *Job) error {
		if !j.Stdin && !j.TTY {
			return Errorf(ECONFLICT, "Job %s was not started with stdin: true; it reads /dev/null.", id)
		}
		return nil
	}, "its input is closed", "send its input once it runs")
	if err != nil {
		return err
	}
	reply, err := s.disp.Control(ctx, runner, &Control{Op: proto.OpStdin, JobID: id, Data: data, Close: closeIt})
	if err != nil {
		return Errorf(EUNAVAILABLE, "Runner %s did not answer: %v.", runner, err)
	}
	switch reply.Code {
	case proto.ReplyOK:
		return nil
	case proto.ReplyUnknownJob:
		return Errorf(ECONFLICT, "Job %s has ended; its input is closed.", id)
	case proto.ReplyRefused:
		return Errorf(ECONFLICT, "%s.", reply.Message)
	}
	return Errorf(EINTERNAL, "Runner %s refused: %s.", runner, reply.Message)
}

// runnerOf returns the runner of job id once it runs, waiting up to inputStartWait for a queued
// job to start, for the control requests that need a running job (input, resize). check refuses a
// job the request does not fit; ended and notYet end the sentences that refuse an ended job and
// one that did not start in time.
func (s *Service) runnerOf(ctx context.Context, id string, check func(*Job) error, ended, notYet string) (string, error) {
	deadline := time.NewTimer(inputStartWait)
	defer deadline.Stop()
	for {
		j, _, changed, err := s.current(ctx, id)
		if err != nil {
			return "", err
		}
		if changed == nil {
			return "", Errorf(ECONFLICT, "Job %s has ended; %s.", id, ended)
		}
		if err := check(j); err != nil {
			return "", err
		}
		if j.Status == StatusRunning {
			return j.Runner, nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			return "", Errorf(ECONFLICT, "Job %s has not started yet; %s.", id, notYet)
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}
