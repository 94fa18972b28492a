package coordinator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// MaxIdempotencyKey is the longest Idempotency-Key accepted.
const MaxIdempotencyKey = 255

// ValidIdempotencyKey tells whether key is 1 to MaxIdempotencyKey printable ASCII characters.
func ValidIdempotencyKey(key string) bool {
	if key == "" || len(key) > MaxIdempotencyKey {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return false
		}
	}
	return true
}

// idempotencyPoll is how often a start that found its key reserved looks again.
const idempotencyPoll = 50 * time.Millisecond

// StartOnce is Start under an idempotency key: the first request with the key starts the job, and
// any later one with the same key and the same request, within a day and on any coordinator of the
// fleet, gets that job in its current state (Replayed) and starts nothing. The same key with
// another request is EIDEMPOTENCY. Keys are per session: the store's key is a hash of the session
// and key, so a key names nothing in another session, and a scoped token, which reaches only its
// sessions, cannot reach another's job by guessing its key.
//
// The key is reserved (created with no job, compare-and-set, so of two racing starts one wins)
// before the job is queued, and given the job's id once it is. A start that finds a reservation
// waits up to Config.IdempotencyWait for the id; one older than Config.AbandonAfter was abandoned
// (its coordinator died between reserving and queuing, or could not record the id) and is taken
// over, by compare-and-set too. A start that fails before its job is queued releases its key.
func (s *Service) StartOnce(ctx context.Context, key string, req StartRequest) (*StartResult, error) {
	if s.cfg.Idempotency == nil {
		return nil, Errorf(EUNAVAILABLE, "Idempotency-Key needs the coordinator's NATS: this coordinator has no store for it.")
	}
	if !ValidIdempotencyKey(key) {
		return nil, Errorf(EINVALID, "Idempotency-Key must be 1 to %d printable ASCII characters.", MaxIdempotencyKey)
	}
	store := s.cfg.Idempotency
	sum := sha256.Sum256([]byte(req.Session + "\x00" + key))
	k := hex.EncodeToString(sum[:])
	hash, err := requestHash(req)
	if err != nil {
		return nil, err
	}
	deadline := s.cfg.Now().Add(s.cfg.IdempotencyWait)
	for {
		rec := IdempotencyRecord{Hash: hash, ReservedAt: s.cfg.Now()}
		stored, rev, created, err := store.CreateKey(ctx, k, rec)
		if err != nil {
			return nil, s.idempotencyError(err)
		}
		if !created && stored.Hash != hash {
			return nil, Errorf(EIDEMPOTENCY, "This Idempotency-Key was used for another request: use a new key for a new start.")
		}
		if !created && stored.JobID != "" {
			return s.replay(ctx, stored.JobID, req.BlockUntil)
		}
		if !created && s.cfg.Now().Sub(stored.ReservedAt) >= s.cfg.AbandonAfter {
			// Abandoned: take it over. Losing this race to another start is no error: look again.
			if rev, err = store.UpdateKey(ctx, k, rec, rev); errors.Is(err, ErrKeyChanged) {
				continue
			} else if err != nil {
				return nil, s.idempotencyError(err)
			}
			created = true
		}
		if created {
			return s.startReserved(ctx, k, rec, rev, req)
		}
		if !s.cfg.Now().Before(deadline) {
			return nil, Errorf(EIDEMPOTENCY, "A start with this Idempotency-Key is still under way: retry in a moment.")
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(idempotencyPoll):
		}
	}
}

// startReserved starts the job of a key reserved at revision rev and records its id.
func (s *Service) startReserved(ctx context.Context, k string, rec IdempotencyRecord, rev uint64, req StartRequest) (*StartResult, error) {
	store := s.cfg.Idempotency
	queued := false
	res, err := s.startJob(ctx, req, func(id string) {
		queued = true
		rec.JobID = id
		// The job runs whatever happens here: a failure leaves the reservation, which a retry
		// takes over after AbandonAfter (a second start) rather than refuse it for a day.
		if _, err := store.UpdateKey(context.WithoutCancel(ctx), k, rec, rev); err != nil {
			s.cfg.Logger.Warn("idempotency: recording the job of a key failed", "job", id, "err", err)
		}
	})
	if err != nil && !queued {
		// Nothing started: free the key for the retry.
		if derr := store.DeleteKey(context.WithoutCancel(ctx), k, rev); derr != nil {
			s.cfg.Logger.Warn("idempotency: releasing a key failed", "err", derr)
		}
	}
	return res, err
}

// replay answers a repeated start with its job as it is now, after BlockUntil's wait as the first
// answer had.
func (s *Service) replay(ctx context.Context, id string, blockUntil time.Duration) (*StartResult, error) {
	job, err := s.Job(ctx, id)
	if err != nil {
		return nil, err
	}
	if blockUntil > 0 && !job.Status.Ended() {
		w, err := s.WaitFor(ctx, id, blockUntil, WaitCond{})
		if err != nil {
			return nil, err
		}
		job = w.Job
	}
	res := &StartResult{Job: job, Backgrounded: !job.Status.Ended(), Replayed: true}
	t, err := s.tail(id)
	if err != nil {
		return nil, err
	}
	res.Output, res.OutputBytes, res.OutputTruncated, res.OutputLines, res.TotalLines = t.data, t.size, t.truncated, t.lines, t.total
	return res, nil
}

// requestHash is the hash of what a start asks for: the decoded request, not its bytes, so that
// a retry that encodes the same request differently (another field order, spacing, the session in
// the header rather than the body) is the same request. BlockUntil is left out: how long the
// caller waits for the answer is not what it starts.
func requestHash(req StartRequest) (string, error) {
	req.BlockUntil = 0
	data, err := json.Marshal(req) // struct fields in order, map keys sorted: canonical
	if err != nil {
		return "", fmt.Errorf("hash request: %w", err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// idempotencyError is the caller's error for a failure of the idempotency store.
func (s *Service) idempotencyError(err error) error {
	s.cfg.Logger.Warn("idempotency store", "err", err)
	return Errorf(EUNAVAILABLE, "The Idempotency-Key could not be checked; is NATS reachable?")
}
