package natsbus

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/internal/jsready"
)

// The buckets of the coordinator's state (docs/store.md). StateBucket holds jobs, sessions and each
// session's last seq, for as long as retention keeps them: keys job.<id>, session.<hex(session)>,
// seq.<hex(session)>, and meta.migrated once a data dir of an older sbx was uploaded. NotesBucket
// holds the notifications, keyed <hex(session)>.<seq as 16 hex digits>, for RetainAge.
const (
	StateBucket = "SBX_STATE"
	NotesBucket = "SBX_NOTES"
)

const (
	jobPrefix     = "job."
	sessionPrefix = "session."
	seqPrefix     = "seq."
	migratedKey   = "meta.migrated"
)

// loadBatch is how many jobs or notifications Sync hands the cache in one write, and how many
// notifications a migration reads from it at a time.
const loadBatch = 512

// StateCache is the coordinator's local copy of the state (store.DB): it serves the reads, and State
// keeps it equal to the buckets.
type StateCache interface {
	coordinator.Store
	// Reset empties the cache.
	Reset(ctx context.Context) error
	// PutJobs stores jobs as PutJob does, in one write.
	PutJobs(ctx context.Context, jobs []*coordinator.Job) error
	// PutNotifications stores notifications with the seqs they carry, raising their sessions' last
	// seq to them.
	PutNotifications(ctx context.Context, notes []*coordinator.Notification) error
	// RaiseLastSeq raises a session's last seq to seq; a higher one stays.
	RaiseLastSeq(ctx context.Context, session string, seq uint64) error
	// AddNotificationsWith is AddNotifications calling write with the notifications it adds (seqs
	// set, not those already stored) before it keeps them; when write fails it adds nothing.
	AddNotificationsWith(ctx context.Context, notes []*coordinator.Notification, write func(added []*coordinator.Notification) error) error
}

// StateConfig configures the state's buckets.
type StateConfig struct {
	// Replicas of each bucket (1), as Config.Replicas: an existing bucket with another count is refused.
	Replicas int
	// RetainAge is how long a notification stays in NotesBucket (0: no limit); the coordinator's
	// retention removes older ones too.
	RetainAge time.Duration
	Logger    *slog.Logger
}

// State implements coordinator.Store over two JetStream KV buckets, the state's home, with a cache
// that serves every read. One coordinator at a time writes (the lease holder), so no write needs a
// compare-and-set: each goes to its bucket first and then to the cache, and a write the bucket
// refuses leaves the cache as it was. The cache can always be rebuilt: Sync.
type State struct {
	cfg   StateConfig
	nc    *nats.Conn
	cache StateCache
	state jetstream.KeyValue
	notes jetstream.KeyValue
	// stateStream and notesStream are the buckets' streams, purged by subject: a purge leaves no
	// delete marker, which the state bucket, with no age limit, would keep for ever.
	stateStream jetstream.Stream
	notesStream jetstream.Stream

	// mu orders the writes so that the buckets and the cache see them in the same order.
	mu sync.Mutex
}

var _ coordinator.Store = (*State)(nil)

// OpenState creates (or updates) the buckets and returns a State over cache. A cache holding what an
// sbx from before the state moved to JetStream wrote is uploaded first, once for the buckets (migrate).
// Call Sync before reading through the State.
func OpenState(ctx context.Context, nc *nats.Conn, cache StateCache, cfg StateConfig) (*State, error) {
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	s := &State{cfg: cfg, nc: nc, cache: cache}
	if s.state, s.stateStream, err = bucket(ctx, js, StateBucket, 0, cfg.Replicas, stateRemedy); err != nil {
		return nil, err
	}
	if s.notes, s.notesStream, err = bucket(ctx, js, NotesBucket, cfg.RetainAge, cfg.Replicas, stateRemedy); err != nil {
		return nil, err
	}
	if err := s.migrate(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// bucket creates or updates a bucket of sbx's (one value a key, no byte bound, file storage, replicas
// as the streams), keeping values for ttl (0: for ever), and returns it with its stream. An existing
// bucket of another replica count is refused with remedy (checkReplicas).
func bucket(ctx context.Context, js jetstream.JetStream, name string, ttl time.Duration, replicas int, remedy string) (jetstream.KeyValue, jetstream.Stream, error) {
	stream := "KV_" + name
	if err := checkReplicas(ctx, js, stream, replicas, remedy); err != nil {
		return nil, nil, err
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: name, History: 1, TTL: ttl, Storage: jetstream.FileStorage, Replicas: replicas, MaxBytes: -1,
	})
	if err != nil {
		return nil, nil, replicasError(stream, replicas, err)
	}
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	return kv, st, nil
}

// stateRemedy is checkReplicas's advice for the state's buckets, which hold the fleet's only copy.
const stateRemedy = `; the buckets hold every job and notification: to change their count, see docs/store.md, "Replicas"`

// migrate uploads the cache's content unless the state bucket says it was done. A data dir written
// before the state moved to JetStream holds the jobs, sessions and notifications in its cache (the
// bbolt file it was then): uploaded, nothing is lost to the upgrade. Only the first coordinator to
// start on the buckets uploads its cache; every later one finds meta.migrated, and its Sync replaces
// its cache with the buckets' content. A crash before meta.migrated is written uploads again, the
// same keys with the same values.
func (s *State) migrate(ctx context.Context) error {
	_, err := s.state.Get(ctx, migratedKey)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("bucket %s, key %s: %w", StateBucket, migratedKey, err)
	}
	var jobs, notes int
	var putErr error
	err = s.cache.OldestJobs(ctx, func(j *coordinator.Job) bool {
		putErr = s.putJob(ctx, j)
		jobs++
		return putErr == nil
	})
	if err = errors.Join(err, putErr); err != nil {
		return fmt.Errorf("upload the data dir's jobs: %w", err)
	}
	sessions, err := s.cache.Sessions(ctx)
	if err != nil {
		return fmt.Errorf("upload the data dir's sessions: %w", err)
	}
	for _, st := range sessions {
		if err := s.putSession(ctx, st); err != nil {
			return err
		}
		if st.LastSeq == 0 {
			continue
		}
		if err := s.putLastSeq(ctx, st.ID, st.LastSeq); err != nil {
			return err
		}
		for after := uint64(0); ; {
			page, err := s.cache.Notifications(ctx, st.ID, after, loadBatch)
			if err != nil {
				return fmt.Errorf("upload the data dir's notifications: %w", err)
			}
			for _, n := range page {
				if err := s.putNote(ctx, n); err != nil {
					return err
				}
				after = n.Seq
			}
			notes += len(page)
			if len(page) < loadBatch {
				break
			}
		}
	}
	if _, err := s.state.Put(ctx, migratedKey, []byte(time.Now().UTC().Format(time.RFC3339))); err != nil {
		return fmt.Errorf("bucket %s, key %s: %w", StateBucket, migratedKey, err)
	}
	if jobs+len(sessions) > 0 {
		s.cfg.Logger.Info("state uploaded from the data dir to JetStream", "jobs", jobs, "sessions", len(sessions), "notifications", notes)
	}
	return nil
}

// Sync makes the cache exactly what the buckets hold: jobs, sessions, their last seqs and the
// notifications the notes bucket still has. A coordinator calls it when it starts to lead, before
// coordinator.New reads the cache.
func (s *State) Sync(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.cache.Reset(ctx); err != nil {
		return err
	}
	var jobs []*coordinator.Job
	err := eachEntry(ctx, s.state, func(key string, value []byte) error {
		switch {
		case strings.HasPrefix(key, jobPrefix):
			var j coordinator.Job
			if err := json.Unmarshal(value, &j); err != nil {
				return fmt.Errorf("key %s: %w", key, err)
			}
			if jobs = append(jobs, &j); len(jobs) == loadBatch {
				err := s.cache.PutJobs(ctx, jobs)
				jobs = jobs[:0]
				return err
			}
		case strings.HasPrefix(key, sessionPrefix):
			var st coordinator.Session
			if err := json.Unmarshal(value, &st); err != nil {
				return fmt.Errorf("key %s: %w", key, err)
			}
			return s.cache.PutSession(ctx, &st)
		case strings.HasPrefix(key, seqPrefix):
			id, err := hex.DecodeString(strings.TrimPrefix(key, seqPrefix))
			if err != nil {
				return fmt.Errorf("key %s: %w", key, err)
			}
			seq, err := strconv.ParseUint(string(value), 10, 64)
			if err != nil {
				return fmt.Errorf("key %s: %w", key, err)
			}
			return s.cache.RaiseLastSeq(ctx, string(id), seq)
		}
		return nil
	})
	if err == nil && len(jobs) > 0 {
		err = s.cache.PutJobs(ctx, jobs)
	}
	if err != nil {
		return fmt.Errorf("sync bucket %s: %w", StateBucket, err)
	}
	var notes []*coordinator.Notification
	err = eachEntry(ctx, s.notes, func(key string, value []byte) error {
		var n coordinator.Notification
		if err := json.Unmarshal(value, &n); err != nil {
			return fmt.Errorf("key %s: %w", key, err)
		}
		if notes = append(notes, &n); len(notes) == loadBatch {
			err := s.cache.PutNotifications(ctx, notes)
			notes = notes[:0]
			return err
		}
		return nil
	})
	if err == nil && len(notes) > 0 {
		err = s.cache.PutNotifications(ctx, notes)
	}
	if err != nil {
		return fmt.Errorf("sync bucket %s: %w", NotesBucket, err)
	}
	return nil
}

// eachEntry calls f with every key of kv and its value, until f fails.
func eachEntry(ctx context.Context, kv jetstream.KeyValue, f func(key string, value []byte) error) error {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		select {
		case e := <-w.Updates():
			// A nil entry ends the keys there were when the watch began.
			if e == nil {
				return nil
			}
			if err := f(e.Key(), e.Value()); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// PutJob implements coordinator.JobStore.
func (s *State) PutJob(ctx context.Context, job *coordinator.Job) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.putJob(ctx, job); err != nil {
		return err
	}
	return s.cache.PutJob(ctx, job)
}

// PutSession implements coordinator.SessionStore.
func (s *State) PutSession(ctx context.Context, st *coordinator.Session) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.putSession(ctx, st); err != nil {
		return err
	}
	return s.cache.PutSession(ctx, st)
}

// AddNotifications implements coordinator.NotificationStore. The cache gives the seqs (and knows
// the notifications stored already); the new ones go to the buckets before the cache keeps them.
// Each session's last seq is raised before its notifications are written: a crash between the two
// leaves seqs unused, never a seq that Sync would give again to another notification, even once
// the notes bucket no longer has the first.
func (s *State) AddNotifications(ctx context.Context, notes []*coordinator.Notification) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cache.AddNotificationsWith(ctx, notes, func(added []*coordinator.Notification) error {
		last := map[string]uint64{}
		var sessions []string
		for _, n := range added {
			if _, ok := last[n.Session]; !ok {
				sessions = append(sessions, n.Session)
			}
			last[n.Session] = max(last[n.Session], n.Seq)
		}
		for _, id := range sessions {
			if err := s.putLastSeq(ctx, id, last[id]); err != nil {
				return err
			}
		}
		for _, n := range added {
			if err := s.putNote(ctx, n); err != nil {
				return err
			}
		}
		return nil
	})
}

// DeleteJobs implements coordinator.RetentionStore: each job's key is purged, then the job leaves
// the cache. It holds the writes back one job at a time, not for a whole retention pass.
func (s *State) DeleteJobs(ctx context.Context, ids []string) error {
	for _, id := range ids {
		if err := s.deleteJob(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

func (s *State) deleteJob(ctx context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stateStream.Purge(ctx, jetstream.WithPurgeSubject(subject(StateBucket, jobPrefix+id))); err != nil {
		return writeError(fmt.Errorf("delete job %s from bucket %s: %w", id, StateBucket, err))
	}
	return s.cache.DeleteJobs(ctx, []string{id})
}

// DeleteNotificationsBefore implements coordinator.RetentionStore. The notes bucket's age limit
// removes most of them by itself; what it kept longer (notifications uploaded from an older data
// dir, or kept under a longer RetainAge) is purged per session, up to the last one removed: a
// session's notifications are written in seq order, so its keys' revisions follow their seqs, and
// notifications added meanwhile are above the bound.
func (s *State) DeleteNotificationsBefore(ctx context.Context, cutoff time.Time) (int, error) {
	sessions, err := s.cache.Sessions(ctx)
	if err != nil {
		return 0, err
	}
	for _, st := range sessions {
		last, err := s.lastBefore(ctx, st.ID, cutoff)
		if err != nil {
			return 0, err
		}
		if last == 0 {
			continue
		}
		e, err := s.notes.Get(ctx, noteKey(st.ID, last))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired, and every older message of the bucket with it
		}
		if err != nil {
			return 0, writeError(fmt.Errorf("bucket %s: %w", NotesBucket, err))
		}
		err = s.notesStream.Purge(ctx, jetstream.WithPurgeSubject(subject(NotesBucket, hex.EncodeToString([]byte(st.ID))+".>")), jetstream.WithPurgeSequence(e.Revision()+1))
		if err != nil {
			return 0, writeError(fmt.Errorf("delete notifications of session %s from bucket %s: %w", st.ID, NotesBucket, err))
		}
	}
	return s.cache.DeleteNotificationsBefore(ctx, cutoff)
}

// lastBefore returns the seq of the session's last notification in the cache created before
// cutoff (0: none). Seq order is creation order within a session.
func (s *State) lastBefore(ctx context.Context, session string, cutoff time.Time) (uint64, error) {
	var last uint64
	for {
		page, err := s.cache.Notifications(ctx, session, last, loadBatch)
		if err != nil {
			return 0, err
		}
		for _, n := range page {
			if !n.CreatedAt.Before(cutoff) {
				return last, nil
			}
			last = n.Seq
		}
		if len(page) < loadBatch {
			return last, nil
		}
	}
}

// Job implements coordinator.JobStore from the cache.
func (s *State) Job(ctx context.Context, id string) (*coordinator.Job, error) {
	return s.cache.Job(ctx, id)
}

// Jobs implements coordinator.JobStore from the cache.
func (s *State) Jobs(ctx context.Context, f coordinator.JobFilter) ([]*coordinator.Job, error) {
	return s.cache.Jobs(ctx, f)
}

// UnfinishedJobs implements coordinator.JobStore from the cache.
func (s *State) UnfinishedJobs(ctx context.Context) ([]*coordinator.Job, error) {
	return s.cache.UnfinishedJobs(ctx)
}

// OldestJobs implements coordinator.RetentionStore from the cache.
func (s *State) OldestJobs(ctx context.Context, f func(*coordinator.Job) bool) error {
	return s.cache.OldestJobs(ctx, f)
}

// Notifications implements coordinator.NotificationStore from the cache.
func (s *State) Notifications(ctx context.Context, session string, after uint64, limit int) ([]*coordinator.Notification, error) {
	return s.cache.Notifications(ctx, session, after, limit)
}

// Sessions implements coordinator.SessionStore from the cache: each session's LastSeq is the one
// its seq key holds, which outlives the notifications.
func (s *State) Sessions(ctx context.Context) ([]*coordinator.Session, error) {
	return s.cache.Sessions(ctx)
}

func (s *State) putJob(ctx context.Context, j *coordinator.Job) error {
	data, err := json.Marshal(j)
	if err != nil {
		return fmt.Errorf("encode job %s: %w", j.ID, err)
	}
	return s.put(ctx, s.state, jobPrefix+j.ID, data, "job "+j.ID)
}

func (s *State) putSession(ctx context.Context, st *coordinator.Session) error {
	data, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode session %s: %w", st.ID, err)
	}
	return s.put(ctx, s.state, sessionPrefix+hex.EncodeToString([]byte(st.ID)), data, "session "+st.ID)
}

func (s *State) putLastSeq(ctx context.Context, session string, seq uint64) error {
	return s.put(ctx, s.state, seqPrefix+hex.EncodeToString([]byte(session)), strconv.AppendUint(nil, seq, 10), "last seq of session "+session)
}

func (s *State) putNote(ctx context.Context, n *coordinator.Notification) error {
	data, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("encode notification %s: %w", n.ID, err)
	}
	return s.put(ctx, s.notes, noteKey(n.Session, n.Seq), data, "notification "+n.ID)
}

// put writes one value. A value is one NATS message: one larger than the server's max_payload
// (1 MiB by default; sbx serve's is 2 MiB) is refused here, saying so. The API's bounds keep a job
// well below 1 MiB (TestStateLargestJob).
func (s *State) put(ctx context.Context, kv jetstream.KeyValue, key string, data []byte, what string) error {
	if max := s.nc.MaxPayload(); int64(len(data)) > max {
		return fmt.Errorf("store %s: it is %d bytes encoded, more than NATS takes in one message (max_payload %d)", what, len(data), max)
	}
	if _, err := kv.Put(ctx, key, data); err != nil {
		return writeError(fmt.Errorf("store %s in bucket %s: %w", what, kv.Bucket(), err))
	}
	return nil
}

// writeError marks err, a failed write to a bucket, unavailable when JetStream could not answer, so
// that the API says 503, as it does for a start that could not be queued: the caller may retry.
func writeError(err error) error {
	if jsready.NotReady(err) || notSent(err) {
		return fmt.Errorf("%w: %w", coordinator.Errorf(coordinator.EUNAVAILABLE, "The coordinator could not write its state to JetStream; is NATS reachable?"), err)
	}
	return err
}

// noteKey is a notification's key in NotesBucket: the seq in fixed-width hex, so that a session's
// keys sort in seq order.
func noteKey(session string, seq uint64) string {
	return fmt.Sprintf("%s.%016x", hex.EncodeToString([]byte(session)), seq)
}

// subject is the subject of key in bucket's stream.
func subject(bucket, key string) string { return "$KV." + bucket + "." + key }
