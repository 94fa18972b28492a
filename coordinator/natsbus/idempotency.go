package natsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/coordinator"
)

// The bucket of idempotency keys: shared by every coordinator of the fleet, a key kept a day
// after its last write, one revision each (only the latest is ever read).
const (
	IdempotencyBucket = "SBX_IDEMPOTENCY"
	IdempotencyTTL    = 24 * time.Hour
)

var _ coordinator.IdempotencyStore = (*Bus)(nil)

// CreateKey implements coordinator.IdempotencyStore with KV Create, which fails when the key
// exists: the compare-and-set that lets one of two racing starts win.
func (b *Bus) CreateKey(ctx context.Context, key string, rec coordinator.IdempotencyRecord) (coordinator.IdempotencyRecord, uint64, bool, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return rec, 0, false, fmt.Errorf("encode idempotency record: %w", err)
	}
	for {
		rev, err := b.keys.Create(ctx, key, data)
		if err == nil {
			return rec, rev, true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return rec, 0, false, fmt.Errorf("create idempotency key: %w", err)
		}
		e, err := b.keys.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired or released since: create it again
		}
		if err != nil {
			return rec, 0, false, fmt.Errorf("get idempotency key: %w", err)
		}
		var stored coordinator.IdempotencyRecord
		if err := json.Unmarshal(e.Value(), &stored); err != nil {
			return rec, 0, false, fmt.Errorf("decode idempotency record: %w", err)
		}
		return stored, e.Revision(), false, nil
	}
}

// UpdateKey implements coordinator.IdempotencyStore with KV Update at a revision.
func (b *Bus) UpdateKey(ctx context.Context, key string, rec coordinator.IdempotencyRecord, rev uint64) (uint64, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, fmt.Errorf("encode idempotency record: %w", err)
	}
	n, err := b.keys.Update(ctx, key, data, rev)
	if wrongRevision(err) {
		return 0, coordinator.ErrKeyChanged
	}
	if err != nil {
		return 0, fmt.Errorf("update idempotency key: %w", err)
	}
	return n, nil
}

// DeleteKey implements coordinator.IdempotencyStore with KV Delete at a revision.
func (b *Bus) DeleteKey(ctx context.Context, key string, rev uint64) error {
	err := b.keys.Delete(ctx, key, jetstream.LastRevision(rev))
	if wrongRevision(err) {
		return coordinator.ErrKeyChanged
	}
	if err != nil {
		return fmt.Errorf("delete idempotency key: %w", err)
	}
	return nil
}

// wrongRevision tells whether err is JetStream's refusal of a write at a revision that is no
// longer the key's last.
func wrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
