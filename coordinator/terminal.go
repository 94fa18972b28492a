package coordinator

import (
	"context"

	"github.com/sbx-dev/sbx/proto"
)

// Resize sets the size of a running tty job's terminal; the job gets SIGWINCH. A queued job is
// waited for a few seconds, as Input waits. The job object shows the new size.
func (s *Service) Resize(ctx context.Context, id string, size TTYSize) error {
	if size.Rows < 1 || size.Rows > proto.MaxTTYRows {
		return Errorf(EINVALID, "rows must be between 1 and %d.", proto.MaxTTYRows)
	}
	if size.Cols < 1 || size.Cols > proto.MaxTTYCols {
		return Errorf(EINVALID, "cols must be between 1 and %d.", proto.MaxTTYCols)
	}
	runner, err := s.runnerOf(ctx, id, func(j *Job) error {
		if !j.TTY {
			return Errorf(ECONFLICT, "Job %s has no terminal: it was not started with tty: true.", id)
		}
		return nil
	}, "its terminal is gone", "resize it once it runs")
	if err != nil {
		return err
	}
	reply, err := s.disp.Control(ctx, runner, &Control{Op: proto.OpResize, JobID: id, Size: &size})
	if err != nil {
		return Errorf(EUNAVAILABLE, "Runner %s did not answer: %v.", runner, err)
	}
	switch reply.Code {
	case proto.ReplyOK:
	case proto.ReplyUnknownJob:
		return Errorf(ECONFLICT, "Job %s has ended; its terminal is gone.", id)
	case proto.ReplyRefused:
		return Errorf(ECONFLICT, "%s.", reply.Message)
	default:
		return Errorf(EINTERNAL, "Runner %s refused: %s.", runner, reply.Message)
	}
	return s.jobs.resized(ctx, id, size)
}

// screenText is what a job's output bytes read as: a tty job's without its terminal escape
// sequences (StripANSI), anyone else's as they are.
func screenText(j *Job, b []byte) []byte {
	if !j.TTY {
		return b
	}
	return StripANSI(b)
}
