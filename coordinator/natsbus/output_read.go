package natsbus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/proto"
)

// Bounds of a read from the stream.
const (
	// readerBytes is how much of a job's output one reader fetches ahead.
	readerBytes = 4 << 20
	// aheadBytes bounds the chunks a reader holds that lie past the bytes it waits for: the stream
	// keeps chunks in the order they were stored, which is the order of their offsets unless an
	// event was applied again out of turn.
	aheadBytes = 64 << 20
	// readerIdle is how long the server keeps a reader's consumer once it stops reading.
	readerIdle = 30 * time.Second
	// msgSizeHeader carries a message's size in a headers-only delivery.
	msgSizeHeader = "Nats-Msg-Size"
)

// openStream returns a reader of the job's body bytes [offset, offset+limit) from the stream
// (limit < 0: to the end of what the stream holds now). A bounded read the stream cannot fill fails
// at the first byte it lacks.
func (o *Output) openStream(ctx context.Context, id string, offset, limit int64) (io.ReadCloser, error) {
	subject := proto.JobOutputSubject(id)
	last, err := o.stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		if limit > 0 {
			return nil, missingOutput(id, offset)
		}
		return io.NopCloser(strings.NewReader("")), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read output %s: %w", id, err)
	}
	var start uint64
	if offset > 0 {
		if start, err = o.firstChunk(ctx, subject, offset, last.Sequence); err != nil {
			return nil, fmt.Errorf("read output %s: %w", id, err)
		}
		if start == 0 {
			if limit > 0 {
				return nil, missingOutput(id, offset)
			}
			return io.NopCloser(strings.NewReader("")), nil
		}
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}, InactiveThreshold: readerIdle}
	if start > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, start
	}
	cons, err := o.js.OrderedConsumer(ctx, proto.OutputStream, cfg)
	if err != nil {
		return nil, fmt.Errorf("read output %s: %w", id, err)
	}
	it, err := cons.Messages(jetstream.PullMaxBytes(readerBytes))
	if err != nil {
		return nil, fmt.Errorf("read output %s: %w", id, err)
	}
	end := int64(-1)
	if limit >= 0 {
		end = offset + limit
	}
	return &chunkReader{id: id, js: o.js, cons: cons, it: it, last: last.Sequence, pos: offset, end: end, ahead: map[int64][]byte{}}, nil
}

func missingOutput(id string, offset int64) error {
	return fmt.Errorf("read output %s: the output stream has no byte %d", id, offset)
}

// chunkOffset returns a stored chunk's offset, false for a message that is no chunk.
func chunkOffset(m jetstream.Msg) (int64, bool) {
	off, err := strconv.ParseInt(m.Headers().Get(proto.HeaderOffset), 10, 64)
	return off, err == nil && off >= 0
}

// firstChunk returns the sequence of the first chunk on subject, up to last, holding a byte at or
// after offset; 0 when there is none. It reads headers only: every chunk stored before that one
// ends before offset, so a reader starts there.
func (o *Output) firstChunk(ctx context.Context, subject string, offset int64, last uint64) (uint64, error) {
	cons, err := o.js.OrderedConsumer(ctx, proto.OutputStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject}, HeadersOnly: true, InactiveThreshold: readerIdle,
	})
	if err != nil {
		return 0, err
	}
	it, err := cons.Messages()
	if err != nil {
		return 0, err
	}
	defer stopReading(o.js, cons, it)
	for {
		m, err := it.Next(jetstream.NextMaxWait(outputReadWait))
		if err != nil {
			return 0, err
		}
		meta, err := m.Metadata()
		if err != nil {
			return 0, err
		}
		size, serr := strconv.ParseInt(m.Headers().Get(msgSizeHeader), 10, 64)
		if off, ok := chunkOffset(m); ok && serr == nil && off+size > offset {
			return meta.Sequence.Stream, nil
		}
		if meta.Sequence.Stream >= last || meta.NumPending == 0 {
			return 0, nil
		}
	}
}

// chunkReader reads a job's body from its chunks in the stream, in stream order: it skips the
// bytes it already gave (a chunk stored twice) and holds chunks that come before their turn.
type chunkReader struct {
	id   string
	js   jetstream.JetStream
	cons jetstream.Consumer
	it   jetstream.MessagesContext
	last uint64 // the subject's last sequence when the read began: what there is "now"
	done bool   // the chunk at last was read

	pos, end int64 // the next byte to give; the end of the range (-1: none)
	buf      []byte
	ahead    map[int64][]byte
	held     int64 // bytes in ahead
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if r.end >= 0 && r.pos >= r.end {
		return 0, io.EOF
	}
	for len(r.buf) == 0 {
		if r.takeAhead() {
			break
		}
		if r.done {
			if r.end >= 0 {
				return 0, missingOutput(r.id, r.pos)
			}
			return 0, io.EOF
		}
		if err := r.next(); err != nil {
			return 0, err
		}
	}
	b := r.buf
	if r.end >= 0 && int64(len(b)) > r.end-r.pos {
		b = b[:r.end-r.pos]
	}
	n := copy(p, b)
	r.buf, r.pos = r.buf[n:], r.pos+int64(n)
	return n, nil
}

// next reads one more chunk from the stream.
func (r *chunkReader) next() error {
	m, err := r.it.Next(jetstream.NextMaxWait(outputReadWait))
	if err != nil {
		return fmt.Errorf("read output %s: %w", r.id, err)
	}
	meta, err := m.Metadata()
	if err != nil {
		return fmt.Errorf("read output %s: %w", r.id, err)
	}
	if meta.Sequence.Stream >= r.last || meta.NumPending == 0 {
		r.done = true
	}
	off, ok := chunkOffset(m)
	data := m.Data()
	switch {
	case !ok || off+int64(len(data)) <= r.pos:
	case off <= r.pos:
		r.buf = data[r.pos-off:]
	case r.held+int64(len(data)) > aheadBytes:
		return fmt.Errorf("read output %s: byte %d is not among the next %d bytes of chunks", r.id, r.pos, aheadBytes)
	default:
		r.ahead[off] = data
		r.held += int64(len(data))
	}
	return nil
}

// takeAhead makes the held chunk that holds byte pos the one to give, dropping those wholly before
// it; it reports whether there was one.
func (r *chunkReader) takeAhead() bool {
	found := false
	for off, data := range r.ahead {
		end := off + int64(len(data))
		if !found && off <= r.pos && r.pos < end {
			r.buf, found = data[r.pos-off:], true
		}
		if end <= r.pos || off <= r.pos {
			delete(r.ahead, off)
			r.held -= int64(len(data))
		}
	}
	return found
}

// Close stops the read.
func (r *chunkReader) Close() error {
	stopReading(r.js, r.cons, r.it)
	return nil
}

// stopReading stops it and deletes its consumer, rather than leave it to the server for readerIdle:
// a coordinator that serves many reads from the stream would keep as many consumers.
func stopReading(js jetstream.JetStream, cons jetstream.Consumer, it jetstream.MessagesContext) {
	it.Stop()
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), outputReadWait)
	defer cancel()
	// Failing leaves the consumer to expire: nothing to report.
	_ = js.DeleteConsumer(ctx, proto.OutputStream, info.Name)
}
