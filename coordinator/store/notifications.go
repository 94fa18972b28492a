package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/sbx-dev/sbx/coordinator"
)

var (
	// bucketNotifications holds one bucket per session, keyed by seq (8 bytes, big-endian); the
	// bucket's own sequence is the session's last seq.
	bucketNotifications = []byte("notifications")
	// bucketNotificationIDs maps a notification's id to its seq, to store it once.
	bucketNotificationIDs = []byte("notification_ids")
	bucketSessions        = []byte("sessions")
)

func seqKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

// AddNotifications stores notifications, each with the next seq of its session, in one transaction.
// One whose id is already stored keeps its seq and is not stored again.
func (d *DB) AddNotifications(ctx context.Context, notes []*coordinator.Notification) error {
	return d.AddNotificationsWith(ctx, notes, nil)
}

// AddNotificationsWith is AddNotifications that, when write is not nil, calls it with the
// notifications it is about to add (their seqs set; not those already stored) before it commits
// them. When write fails nothing is added, and the next call takes the same seqs again:
// natsbus.State writes the notifications to JetStream there, so that the database never holds one
// that JetStream lacks.
func (d *DB) AddNotificationsWith(_ context.Context, notes []*coordinator.Notification, write func(added []*coordinator.Notification) error) error {
	err := d.db.Update(func(tx *bbolt.Tx) error {
		ids := tx.Bucket(bucketNotificationIDs)
		var added []*coordinator.Notification
		for _, n := range notes {
			if v := ids.Get([]byte(n.ID)); v != nil {
				n.Seq = binary.BigEndian.Uint64(v)
				continue
			}
			b, err := tx.Bucket(bucketNotifications).CreateBucketIfNotExists([]byte(n.Session))
			if err != nil {
				return err
			}
			if n.Seq, err = b.NextSequence(); err != nil {
				return err
			}
			if err := putNotification(tx, b, n); err != nil {
				return err
			}
			added = append(added, n)
		}
		if write == nil || len(added) == 0 {
			return nil
		}
		return write(added)
	})
	if err != nil {
		return fmt.Errorf("store notifications: %w", err)
	}
	return nil
}

// PutNotifications stores notifications with the seqs they carry, replacing any stored at those
// seqs, and raises each session's last seq to the highest of them. Sync loads JetStream's
// notifications with it.
func (d *DB) PutNotifications(_ context.Context, notes []*coordinator.Notification) error {
	err := d.db.Update(func(tx *bbolt.Tx) error {
		for _, n := range notes {
			b, err := tx.Bucket(bucketNotifications).CreateBucketIfNotExists([]byte(n.Session))
			if err != nil {
				return err
			}
			if n.Seq > b.Sequence() {
				if err := b.SetSequence(n.Seq); err != nil {
					return err
				}
			}
			if err := putNotification(tx, b, n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store notifications: %w", err)
	}
	return nil
}

// RaiseLastSeq raises a session's last seq to seq (a higher one stays): its next notification takes
// the seq after, even when none of its notifications is stored any more.
func (d *DB) RaiseLastSeq(_ context.Context, session string, seq uint64) error {
	err := d.db.Update(func(tx *bbolt.Tx) error {
		b, err := tx.Bucket(bucketNotifications).CreateBucketIfNotExists([]byte(session))
		if err != nil {
			return err
		}
		if seq <= b.Sequence() {
			return nil
		}
		return b.SetSequence(seq)
	})
	if err != nil {
		return fmt.Errorf("store last seq of session %s: %w", session, err)
	}
	return nil
}

// putNotification stores n at its seq in b, its session's bucket, and indexes its id.
func putNotification(tx *bbolt.Tx, b *bbolt.Bucket, n *coordinator.Notification) error {
	data, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("encode notification %s: %w", n.ID, err)
	}
	if err := b.Put(seqKey(n.Seq), data); err != nil {
		return err
	}
	return tx.Bucket(bucketNotificationIDs).Put([]byte(n.ID), seqKey(n.Seq))
}

// Notifications returns up to limit notifications of the session with seq > after, in order.
func (d *DB) Notifications(_ context.Context, session string, after uint64, limit int) ([]*coordinator.Notification, error) {
	notes := []*coordinator.Notification{}
	err := d.db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketNotifications).Bucket([]byte(session))
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for k, v := c.Seek(seqKey(after + 1)); k != nil && (limit <= 0 || len(notes) < limit); k, v = c.Next() {
			var n coordinator.Notification
			if err := json.Unmarshal(v, &n); err != nil {
				return fmt.Errorf("decode notification: %w", err)
			}
			notes = append(notes, &n)
		}
		return nil
	})
	return notes, err
}

// PutSession creates or replaces a session.
func (d *DB) PutSession(_ context.Context, s *coordinator.Session) error {
	data, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode session %s: %w", s.ID, err)
	}
	err = d.db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketSessions).Put([]byte(s.ID), data)
	})
	if err != nil {
		return fmt.Errorf("store session %s: %w", s.ID, err)
	}
	return nil
}

// Sessions returns every session with the seq of its last notification. A session that has
// notifications but no record (it cannot happen through the Service) is returned too.
func (d *DB) Sessions(_ context.Context) ([]*coordinator.Session, error) {
	var all []*coordinator.Session
	err := d.db.View(func(tx *bbolt.Tx) error {
		notes := tx.Bucket(bucketNotifications)
		seen := map[string]bool{}
		err := tx.Bucket(bucketSessions).ForEach(func(k, v []byte) error {
			var s coordinator.Session
			if err := json.Unmarshal(v, &s); err != nil {
				return fmt.Errorf("decode session %s: %w", k, err)
			}
			if b := notes.Bucket(k); b != nil {
				s.LastSeq = b.Sequence()
			}
			seen[s.ID] = true
			all = append(all, &s)
			return nil
		})
		if err != nil {
			return err
		}
		return notes.ForEachBucket(func(k []byte) error {
			if !seen[string(k)] {
				all = append(all, &coordinator.Session{ID: string(k), LastSeq: notes.Bucket(k).Sequence()})
			}
			return nil
		})
	})
	return all, err
}
