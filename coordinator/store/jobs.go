// Package store is the coordinator's persistent store: jobs, notifications and sessions in a bbolt database and each job's output
// in its terminal file. Why bbolt: see docs/store.md.
package store

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"go.etcd.io/bbolt"

	"github.com/sbx-dev/sbx/coordinator"
)

var (
	bucketJobs       = []byte("jobs")
	bucketUnfinished = []byte("unfinished")
)

// DB keeps jobs in a bbolt file. Keys are job ids, which sort by creation time.
type DB struct {
	db *bbolt.DB
}

// Open opens (creating if needed) the database at path. The file is 0600: it holds every job's
// command; a file an older sbx made more open is tightened.
func Open(path string) (*DB, error) {
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 5 * time.Second, NoFreelistSync: true, NoSync: true})
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		db.Close()
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, b := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("create buckets: %w", err)
	}
	return &DB{db: db}, nil
}

var allBuckets = [][]byte{bucketJobs, bucketUnfinished, bucketNotifications, bucketNotificationIDs, bucketSessions}

// Reset empties the database: jobs, sessions and notifications (the last seqs with them). The
// state's home is JetStream (natsbus.State), and Sync fills the database again from it.
func (d *DB) Reset(_ context.Context) error {
	err := d.db.Update(func(tx *bbolt.Tx) error {
		for _, b := range allBuckets {
			if err := tx.DeleteBucket(b); err != nil {
				return err
			}
			if _, err := tx.CreateBucket(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reset store: %w", err)
	}
	return nil
}

// Close closes the database.
func (d *DB) Close() error { return d.db.Close() }

// PutJob creates or replaces a job, keeping the index of unfinished jobs.
func (d *DB) PutJob(_ context.Context, job *coordinator.Job) error {
	data, err := json.Marshal(job)
	if err != nil {
		return fmt.Errorf("encode job %s: %w", job.ID, err)
	}
	if err := d.db.Update(func(tx *bbolt.Tx) error { return putJob(tx, job, data) }); err != nil {
		return fmt.Errorf("store job %s: %w", job.ID, err)
	}
	return nil
}

// PutJobs stores jobs as PutJob does, in one transaction: a Sync loads a whole bucket's jobs.
func (d *DB) PutJobs(_ context.Context, jobs []*coordinator.Job) error {
	err := d.db.Update(func(tx *bbolt.Tx) error {
		for _, job := range jobs {
			data, err := json.Marshal(job)
			if err != nil {
				return fmt.Errorf("encode job %s: %w", job.ID, err)
			}
			if err := putJob(tx, job, data); err != nil {
				return fmt.Errorf("job %s: %w", job.ID, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store jobs: %w", err)
	}
	return nil
}

func putJob(tx *bbolt.Tx, job *coordinator.Job, data []byte) error {
	if err := tx.Bucket(bucketJobs).Put([]byte(job.ID), data); err != nil {
		return err
	}
	if job.Status.Ended() {
		return tx.Bucket(bucketUnfinished).Delete([]byte(job.ID))
	}
	return tx.Bucket(bucketUnfinished).Put([]byte(job.ID), nil)
}

// Job returns one job.
func (d *DB) Job(_ context.Context, id string) (*coordinator.Job, error) {
	var job *coordinator.Job
	err := d.db.View(func(tx *bbolt.Tx) error {
		data := tx.Bucket(bucketJobs).Get([]byte(id))
		if data == nil {
			return coordinator.Errorf(coordinator.ENOTFOUND, "Job %q does not exist.", id)
		}
		var err error
		job, err = decode(data)
		return err
	})
	return job, err
}

// Jobs returns the jobs matching f, newest first.
func (d *DB) Jobs(_ context.Context, f coordinator.JobFilter) ([]*coordinator.Job, error) {
	var jobs []*coordinator.Job
	err := d.db.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketJobs).Cursor()
		for k, v := c.Last(); k != nil; k, v = c.Prev() {
			if f.Limit > 0 && len(jobs) >= f.Limit {
				break
			}
			job, err := decode(v)
			if err != nil {
				return err
			}
			if (f.Session != "" && job.Session != f.Session) || (f.Status != "" && job.Status != f.Status) ||
				!strings.HasPrefix(job.Session, f.SessionPrefix) {
				continue
			}
			jobs = append(jobs, job)
		}
		return nil
	})
	return jobs, err
}

// UnfinishedJobs returns every job that has not ended.
func (d *DB) UnfinishedJobs(_ context.Context) ([]*coordinator.Job, error) {
	var jobs []*coordinator.Job
	err := d.db.View(func(tx *bbolt.Tx) error {
		all := tx.Bucket(bucketJobs)
		return tx.Bucket(bucketUnfinished).ForEach(func(k, _ []byte) error {
			job, err := decode(all.Get(k))
			if err != nil {
				return err
			}
			jobs = append(jobs, job)
			return nil
		})
	})
	return jobs, err
}

func decode(data []byte) (*coordinator.Job, error) {
	var job coordinator.Job
	if err := json.Unmarshal(data, &job); err != nil {
		return nil, fmt.Errorf("decode job: %w", err)
	}
	return &job, nil
}
