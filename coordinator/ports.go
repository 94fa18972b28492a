package coordinator

import (
	"context"
	"errors"
	"io"
	"time"
)

// JobStore keeps jobs durably.
type JobStore interface {
	// PutJob creates or replaces a job.
	PutJob(ctx context.Context, job *Job) error
	// Job returns a job, or an ENOTFOUND error.
	Job(ctx context.Context, id string) (*Job, error)
	// Jobs returns jobs matching the filter, newest first.
	Jobs(ctx context.Context, f JobFilter) ([]*Job, error)
	// UnfinishedJobs returns every job not yet ended, for recovery after a restart.
	UnfinishedJobs(ctx context.Context) ([]*Job, error)
}

// JobFilter selects jobs in a listing. Zero fields select everything.
type JobFilter struct {
	Session string
	Status  Status
	Limit   int

	// SessionPrefix, when set, selects the jobs whose session starts with it (a scoped token's).
	SessionPrefix string
}

// OutputStore keeps each job's output in its terminal file (<data>/terminals/<id>.txt): a header
// written when the job starts, the raw output, a footer when it ends.
type OutputStore interface {
	// Path is where the job's terminal file is (or will be).
	Path(id string) string
	// Begin writes the header of a started job. Calling it again for the same job rewrites it.
	Begin(job *Job) error
	// Write puts output bytes at their offset in the body.
	Write(id string, offset int64, p []byte) error
	// Touch rewrites the header's running_for_ms in place.
	Touch(job *Job, runningFor time.Duration) error
	// End rewrites the header's status and appends the footer after job.OutputBytes of body.
	End(job *Job) error
	// Size is the number of body bytes on disk (0 when there is no file).
	Size(id string) (int64, error)
	// Remove deletes an ended job's terminal file.
	Remove(id string) error
	// Open returns a reader of the body, positioned at offset; it reads at most limit bytes
	// (limit < 0: to the end of what is on disk now).
	Open(id string, offset, limit int64) (io.ReadCloser, error)
}

// Dispatcher hands work to the runners and talks to them.
type Dispatcher interface {
	// Dispatch queues the work and returns its sequence in the work stream.
	Dispatch(ctx context.Context, w *Work) (uint64, error)
	// Withdraw removes queued work that no runner took yet. It reports false when it was already taken.
	Withdraw(ctx context.Context, seq uint64) (bool, error)
	// Control sends a request to one runner and returns its reply.
	Control(ctx context.Context, runner string, c *Control) (*ControlReply, error)
}

// Store is everything the coordinator keeps durably.
type Store interface {
	JobStore
	NotificationStore
	SessionStore
	RetentionStore
}

// RetentionStore removes what the coordinator no longer keeps (see Service.retain).
type RetentionStore interface {
	// OldestJobs calls f with jobs in creation order, oldest first, until f returns false.
	OldestJobs(ctx context.Context, f func(*Job) bool) error
	// DeleteJobs removes jobs by id.
	DeleteJobs(ctx context.Context, ids []string) error
	// DeleteNotificationsBefore removes the notifications created before cutoff; seqs are not reused.
	DeleteNotificationsBefore(ctx context.Context, cutoff time.Time) (int, error)
}

// NotificationStore keeps notifications, per session, in sequence.
type NotificationStore interface {
	// AddNotifications stores notifications in order, each taking the next seq of its session. One
	// whose ID is already stored (a redelivered event applied twice) is not stored again: it gets
	// the seq it was stored with.
	AddNotifications(ctx context.Context, notes []*Notification) error
	// Notifications returns up to limit notifications of the session with seq > after, in order.
	Notifications(ctx context.Context, session string, after uint64, limit int) ([]*Notification, error)
}

// SessionStore keeps sessions.
type SessionStore interface {
	// PutSession creates or replaces a session.
	PutSession(ctx context.Context, s *Session) error
	// Sessions returns every session, each with LastSeq, the seq of its last notification.
	Sessions(ctx context.Context) ([]*Session, error)
}

// IdempotencyStore keeps the keys of idempotent starts (Service.StartOnce) where every coordinator
// of a fleet sees them, for a day. Keys are opaque to it: [0-9a-f]+.
type IdempotencyStore interface {
	// CreateKey stores rec under key unless the key exists (compare-and-set): then created is
	// false and stored, rev are the record found and its revision.
	CreateKey(ctx context.Context, key string, rec IdempotencyRecord) (stored IdempotencyRecord, rev uint64, created bool, err error)
	// UpdateKey replaces key's record if it is still at revision rev, and returns the new
	// revision; ErrKeyChanged when it is not.
	UpdateKey(ctx context.Context, key string, rec IdempotencyRecord, rev uint64) (uint64, error)
	// DeleteKey removes key's record if it is still at revision rev; ErrKeyChanged when it is not.
	DeleteKey(ctx context.Context, key string, rev uint64) error
}

// IdempotencyRecord is what an idempotency key holds.
type IdempotencyRecord struct {
	// Hash is the hash of the start request (requestHash).
	Hash string `json:"hash"`
	// JobID is the started job; "" while the start is under way (a reservation).
	JobID string `json:"job_id,omitempty"`
	// ReservedAt is when the start was reserved: a reservation older than Config.AbandonAfter was
	// abandoned by its coordinator and is taken over.
	ReservedAt time.Time `json:"reserved_at"`
}

// ErrKeyChanged is IdempotencyStore's answer when a key is no longer at the revision given.
var ErrKeyChanged = errors.New("idempotency key changed")
