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
func (d *DB) AddNotifications(_ context.Context, notes []*coordinator.Notification) error {
	err := d.db.Update(func(tx *bbolt.Tx) error {
		ids := tx.Bucket(bucketNotificationIDs)
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
			data, err := json.Marshal(n)
			if err != nil {
				return fmt.Errorf("encode notification %s: %w", n.ID, err)
			}
			if err := b.Put(seqKey(n.Seq), data); err != nil {
				return err
			}
			if err := ids.Put([]byte(n.ID), seqKey(n.Seq)); err != nil {
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
