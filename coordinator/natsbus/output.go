package natsbus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/proto"
)

// OutputConfig sizes the output stream; zero fields take their defaults.
type OutputConfig struct {
	// Replicas of the stream on a NATS cluster (1); an existing stream with another count is
	// refused, as Config.Replicas says.
	Replicas int
	// RetainAge is how long a chunk is kept (0: until its job is removed).
	RetainAge time.Duration
	Logger    *slog.Logger
}

// Bounds of the publishes in flight.
const (
	// outputPending is how many chunks may wait for the stream's ack: 16 MiB of full chunks. A
	// Write past it waits (back-pressure: the event consumer reads no further) for at most
	// outputAckWait.
	outputPending = 256
	// outputAckWait bounds the wait for one chunk's ack, and for room among the pending ones.
	outputAckWait = 10 * time.Second
	// outputReadWait bounds the wait for the next chunk of a read from the stream.
	outputReadWait = 5 * time.Second
)

// Output keeps every job's output in the stream proto.OutputStream, one message per chunk on
// proto.JobOutputSubject with its offset, and in the job's terminal file, which is a cache: a
// coordinator that did not write a job's output, or lost its file, reads it from the stream.
// Write publishes without waiting; Flush waits for the stream to have everything written since the
// last Flush, and the event consumer calls it before it acks the events that carried the chunks
// (Bus.SetOutput).
type Output struct {
	cfg    OutputConfig
	files  TerminalFiles
	js     jetstream.JetStream
	stream jetstream.Stream
	// key is the key of the stream's ingest subjects (proto.OutputIngest).
	key string

	mu sync.Mutex
	// pending are the publishes since the last Flush.
	pending []jetstream.PubAckFuture
	// failed is the first publish error seen since the last Flush while pending was pruned.
	failed error
}

var _ coordinator.OutputStore = (*Output)(nil)

// TerminalFiles are the terminal files Output writes: *store.Terminals (an interface, as adapters
// under coordinator/ do not import each other).
type TerminalFiles interface {
	coordinator.OutputStore
	// FreeBytes is the free space of the files' disk.
	FreeBytes() (int64, error)
}

// OpenOutput creates or updates the output stream and returns the Output that keeps output in it and
// in files.
func OpenOutput(ctx context.Context, nc *nats.Conn, files TerminalFiles, cfg OutputConfig) (*Output, error) {
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(outputPending), jetstream.WithPublishAsyncTimeout(outputAckWait))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if err := checkOutputReplicas(ctx, js, cfg.Replicas); err != nil {
		return nil, err
	}
	key, err := ingestKey(ctx, js, proto.OutputStream, proto.OutputKeyOf)
	if err != nil {
		return nil, err
	}
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:     proto.OutputStream,
		Subjects: []string{proto.OutputIngestSubjects(key)},
		SubjectTransform: &jetstream.SubjectTransformConfig{
			Source:      proto.OutputIngestSubjects(key),
			Destination: proto.OutputSubjects,
		},
		Retention: jetstream.LimitsPolicy,
		Storage:   jetstream.FileStorage,
		Replicas:  cfg.Replicas,
		MaxAge:    cfg.RetainAge,
		// Nothing reserved: JetStream reserves a stream's MaxBytes against its disk up front.
		// Output is bounded by the coordinator's budget (Config.OutputBudget) and retention.
		MaxBytes:   -1,
		MaxMsgSize: proto.MaxMessageBytes,
		Duplicates: 2 * time.Minute,
	})
	if err != nil {
		return nil, replicasError(proto.OutputStream, cfg.Replicas, err)
	}
	return &Output{cfg: cfg, files: files, js: js, stream: stream, key: key}, nil
}

// checkOutputReplicas refuses an existing output stream whose replica count is not replicas, for
// the reason checkReplicas gives.
func checkOutputReplicas(ctx context.Context, js jetstream.JetStream, replicas int) error {
	s, err := js.Stream(ctx, proto.OutputStream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("stream %s: %w", proto.OutputStream, err)
	}
	if have := s.CachedInfo().Config.Replicas; have != replicas {
		return fmt.Errorf("stream %s has %d replicas, not %d: sbx does not change an existing stream's replicas; start with %d, or delete the stream %s (the output of every job is lost) and start again",
			proto.OutputStream, have, replicas, have, proto.OutputStream)
	}
	return nil
}

// Path is the job's terminal file.
func (o *Output) Path(id string) string { return o.files.Path(id) }

// Begin writes the header of the job's terminal file.
func (o *Output) Begin(job *coordinator.Job) error { return o.files.Begin(job) }

// Touch rewrites the running time in the terminal file's header.
func (o *Output) Touch(job *coordinator.Job, runningFor time.Duration) error {
	return o.files.Touch(job, runningFor)
}

// End writes the terminal file's footer.
func (o *Output) End(job *coordinator.Job) error { return o.files.End(job) }

// Size is the number of body bytes in the job's terminal file: Sync first completes the files of
// the jobs this coordinator takes over.
func (o *Output) Size(id string) (int64, error) { return o.files.Size(id) }

// FreeBytes is the free space of the terminal files' disk.
func (o *Output) FreeBytes() (int64, error) { return o.files.FreeBytes() }

// chunkID is a chunk's de-duplication id: a redelivered event publishes its chunk again, which the
// stream stores once (within its duplicate window; readers skip later copies).
func chunkID(id string, offset int64, n int) string {
	return id + "." + strconv.FormatInt(offset, 10) + "." + strconv.Itoa(n)
}

// Write publishes the chunk to the stream without waiting for its ack (Flush does), and writes it
// into the terminal file. Past outputPending chunks in flight it waits for room.
func (o *Output) Write(id string, offset int64, p []byte) error {
	msg := &nats.Msg{Subject: proto.OutputIngest(o.key, id), Data: p, Header: nats.Header{}}
	msg.Header.Set(proto.HeaderOffset, strconv.FormatInt(offset, 10))
	f, err := o.js.PublishMsgAsync(msg, jetstream.WithMsgID(chunkID(id, offset, len(p))), jetstream.WithStallWait(outputAckWait))
	if err != nil {
		return fmt.Errorf("publish output %s: %w", id, err)
	}
	o.mu.Lock()
	o.pending = append(o.pending, f)
	if len(o.pending) >= 2*outputPending {
		o.pruneLocked()
	}
	o.mu.Unlock()
	return o.files.Write(id, offset, p)
}

// pruneLocked drops the publishes already answered from pending, keeping the first error, so that
// a writer that flushes seldom does not keep them all. o.mu is held.
func (o *Output) pruneLocked() {
	kept := o.pending[:0]
	for _, f := range o.pending {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			if o.failed == nil {
				o.failed = err
			}
		default:
			kept = append(kept, f)
		}
	}
	clear(o.pending[len(kept):])
	o.pending = kept
}

// Flush returns once the stream stored every chunk written before it was called, or with the first
// error of one it did not store: the events that carried them must then be applied again.
func (o *Output) Flush(ctx context.Context) error {
	o.mu.Lock()
	pending, failed := o.pending, o.failed
	o.pending, o.failed = nil, nil
	o.mu.Unlock()
	errs := []error{failed}
	for _, f := range pending {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs = append(errs, err)
		case <-ctx.Done():
			return fmt.Errorf("store output: %w", ctx.Err())
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("store output: %w", err)
	}
	return nil
}

// Remove purges the job's chunks from the stream and deletes its terminal file; the one goes even
// when the other fails.
func (o *Output) Remove(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), outputReadWait)
	defer cancel()
	var errs []error
	if err := o.stream.Purge(ctx, jetstream.WithPurgeSubject(proto.JobOutputSubject(id))); err != nil {
		errs = append(errs, fmt.Errorf("purge output %s: %w", id, err))
	}
	return errors.Join(append(errs, o.files.Remove(id))...)
}

// Open returns a reader of limit body bytes from offset (limit < 0: all there is now): from the
// terminal file when it holds them, else from the stream.
func (o *Output) Open(id string, offset, limit int64) (io.ReadCloser, error) {
	size, err := o.files.Size(id)
	if err != nil {
		return nil, err
	}
	if limit == 0 || limit < 0 && size > 0 || limit > 0 && offset+limit <= size {
		return o.files.Open(id, offset, limit)
	}
	return o.openStream(context.Background(), id, offset, limit)
}

// Sync makes the terminal files of jobs hold what the stream holds: the header of each started job,
// its output, and the footer of an ended one. A coordinator calls it for the jobs it takes over,
// before it writes their output: their files may be missing or stop where another coordinator took
// over. An unfinished job's file keeps the bytes it has and gets the rest; an ended job's is written
// anew.
func (o *Output) Sync(ctx context.Context, jobs []*coordinator.Job) error {
	for _, j := range jobs {
		if j.StartedAt == nil && j.EndedAt == nil {
			continue // no file before the start
		}
		if j.EndedAt != nil {
			if err := o.files.Remove(j.ID); err != nil {
				return err
			}
		}
		// Begin keeps the body unless the header changes size: the size is taken after it.
		if err := o.files.Begin(j); err != nil {
			return err
		}
		from, err := o.files.Size(j.ID)
		if err != nil {
			return err
		}
		n, err := o.copyStream(ctx, j.ID, from)
		if err != nil {
			return err
		}
		if n > 0 {
			o.cfg.Logger.Info("terminal file completed from the output stream", "job", j.ID, "from", from, "bytes", n)
		}
		if j.EndedAt != nil {
			if err := o.files.End(j); err != nil {
				return err
			}
		}
	}
	return nil
}

// copyStream writes into the job's terminal file the stream's bytes from offset on, and returns how
// many it wrote.
func (o *Output) copyStream(ctx context.Context, id string, offset int64) (int64, error) {
	r, err := o.openStream(ctx, id, offset, -1)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	buf := make([]byte, proto.MaxChunkBytes)
	var written int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := o.files.Write(id, offset+written, buf[:n]); werr != nil {
				return written, werr
			}
			written += int64(n)
		}
		if err == io.EOF {
			return written, nil
		}
		if err != nil {
			return written, err
		}
	}
}
