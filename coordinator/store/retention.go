package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"github.com/sbx-dev/sbx/coordinator"
)

// OldestJobs calls f with jobs in creation order, oldest first, until f returns false or the jobs run
// out. f must not call the store.
func (d *DB) OldestJobs(_ context.Context, f func(*coordinator.Job) bool) error {
	return d.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketJobs).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			job, err := decode(v)
			if err != nil {
				return err
			}
			if !f(job) {
				return nil
			}
		}
		return nil
	})
}

// DeleteJobs removes jobs by id; an id that is not stored is skipped.
func (d *DB) DeleteJobs(_ context.Context, ids []string) error {
	err := d.db.Update(func(tx *bbolt.Tx) error {
		for _, id := range ids {
			if err := tx.Bucket(bucketJobs).Delete([]byte(id)); err != nil {
				return err
			}
			if err := tx.Bucket(bucketUnfinished).Delete([]byte(id)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("delete jobs: %w", err)
	}
	return nil
}

// DeleteNotificationsBefore removes, from every session, the notifications created before cutoff, and
// reports how many. Seqs are never reused: a session's next notification still takes the next seq.
func (d *DB) DeleteNotificationsBefore(_ context.Context, cutoff time.Time) (int, error) {
	n := 0
	err := d.db.Update(func(tx *bbolt.Tx) error {
		ids := tx.Bucket(bucketNotificationIDs)
		all := tx.Bucket(bucketNotifications)
		return all.ForEachBucket(func(session []byte) error {
			b := all.Bucket(session)
			c := b.Cursor()
			for k, v := c.First(); k != nil; k, v = c.First() {
				var note struct {
					ID        string    `json:"id"`
					CreatedAt time.Time `json:"created_at"`
				}
				if err := json.Unmarshal(v, &note); err != nil {
					return fmt.Errorf("decode notification: %w", err)
				}
				// Seq order is creation order within a session.
				if !note.CreatedAt.Before(cutoff) {
					return nil
				}
				if err := c.Delete(); err != nil {
					return err
				}
				if err := ids.Delete([]byte(note.ID)); err != nil {
					return err
				}
				n++
			}
			return nil
		})
	})
	if err != nil {
		return n, fmt.Errorf("delete notifications: %w", err)
	}
	return n, nil
}
