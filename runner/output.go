package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/proto"
)

// deadliner is an output pipe whose reads can time out, so that small writes can be gathered.
type deadliner interface {
	SetReadDeadline(time.Time) error
}

// pump publishes the job's started event, then reads the job's output to EOF and publishes it in
// chunks of at most 64 KiB, in order, with their byte offsets. The started event goes first on the
// same connection and through the same window, so the stream holds it before any chunk, and the job
// runs while it is acked. It never drops a byte: while a chunk cannot be published it stops reading, and
// the job blocks on write. Past limit bytes (when > 0) the job is stopped as output_limit and the
// rest is read and discarded. A job whose standard error has a pipe of its own (Errors) has both read
// at once into the one output, stderr's chunks marked. It returns the number of bytes published.
func (r *Runner) pump(ctx context.Context, j *job, proc process, started *nats.Msg, limit int64, log *slog.Logger) int64 {
	pctx, cancel := r.finalContext(ctx, context.WithoutCancel(ctx))
	defer cancel()
	pub := &publisher{r: r, ctx: pctx, log: log}
	if !pub.send(started) {
		j.stop(proto.ReasonKilled, "the runner lost its connection to NATS")
	}
	// Unbuffered: a reader waits for the chunk before it to be handed over, so while publishing
	// blocks nothing more is read.
	pieces := make(chan piece)
	var readers sync.WaitGroup
	for _, src := range []struct {
		out    io.Reader
		stderr bool
	}{{proc.Output(), false}, {proc.Errors(), true}} {
		if src.out == nil {
			continue
		}
		readers.Add(1)
		go func() {
			defer readers.Done()
			r.readAll(src.out, src.stderr, pieces, log)
		}()
	}
	go func() { readers.Wait(); close(pieces) }()

	var off int64
	full := false // past the limit: read and discard the rest
	for p := range pieces {
		if full {
			continue
		}
		data := p.data
		if limit > 0 && off+int64(len(data)) > limit {
			data = data[:limit-off]
			full = true
			j.stop(proto.ReasonOutputLimit, fmt.Sprintf("the output reached its limit of %d bytes", limit))
		}
		if len(data) == 0 {
			continue
		}
		c := &proto.Chunk{JobID: j.id, Claim: j.claim, Offset: off, Data: data, Stderr: p.stderr}
		if !pub.send(&nats.Msg{Subject: proto.OutputSubject(r.cfg.ID, j.id), Data: c.Data, Header: nats.Header(c.Headers())}) {
			j.stop(proto.ReasonKilled, "the runner could not publish the output")
		}
		off += int64(len(data))
	}
	pub.flush()
	return off
}

// piece is what one read of a job's pipe gave.
type piece struct {
	data   []byte
	stderr bool
}

// waitBytes is the buffer a job's reader waits with: most running jobs are silent most of the time,
// and a 64 KiB buffer each was most of what a sleeping job cost the runner (BenchmarkSleepingJobs).
// Once bytes arrive, a chunk's buffer is borrowed from chunkBufs to gather the rest.
const waitBytes = 512

// chunkBufs holds the buffers of proto.MaxChunkBytes that readers gather into.
var chunkBufs = sync.Pool{New: func() any { b := make([]byte, proto.MaxChunkBytes); return &b }}

// readAll reads out to EOF, handing each read's bytes (gathered for up to Coalesce) to pieces.
func (r *Runner) readAll(out io.Reader, stderr bool, pieces chan<- piece, log *slog.Logger) {
	first := make([]byte, waitBytes)
	for {
		n, err := out.Read(first)
		if n > 0 {
			buf := chunkBufs.Get().(*[]byte)
			copy(*buf, first[:n])
			if err == nil {
				n, err = r.gather(out, *buf, n)
			}
			pieces <- piece{data: append([]byte(nil), (*buf)[:n]...), stderr: stderr}
			chunkBufs.Put(buf)
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				log.Warn("read output", "stderr", stderr, "err", err)
			}
			return
		}
	}
}

// gather reads, for up to Coalesce, whatever else arrives after the n bytes buf holds, up to
// len(buf), and returns how many it holds then.
func (r *Runner) gather(out io.Reader, buf []byte, n int) (int, error) {
	dl, ok := out.(deadliner)
	if !ok || n == len(buf) {
		return n, nil
	}
	if dl.SetReadDeadline(time.Now().Add(r.cfg.Coalesce)) != nil {
		return n, nil
	}
	defer dl.SetReadDeadline(time.Time{})
	for n < len(buf) {
		m, err := out.Read(buf[n:])
		n += m
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// publisher keeps up to PublishWindow chunks in flight and, when a publish fails, publishes it again
// synchronously (the Nats-Msg-Id makes that harmless).
type publisher struct {
	r       *Runner
	ctx     context.Context
	log     *slog.Logger
	pending []inflight
	failed  bool
}

type inflight struct {
	fut jetstream.PubAckFuture
	msg *nats.Msg
}

// send publishes msg; it reports false once publishing has failed for good.
func (p *publisher) send(msg *nats.Msg) bool {
	for len(p.pending) >= p.r.cfg.PublishWindow {
		p.settle()
	}
	if p.failed {
		return false
	}
	fut, err := p.r.js.PublishMsgAsync(msg)
	if err != nil {
		p.retry(msg, err)
		return !p.failed
	}
	p.pending = append(p.pending, inflight{fut, msg})
	return !p.failed
}

// settle waits for the oldest publish.
func (p *publisher) settle() {
	f := p.pending[0]
	p.pending = p.pending[1:]
	select {
	case <-f.fut.Ok():
	case err := <-f.fut.Err():
		p.retry(f.msg, err)
	}
}

func (p *publisher) retry(msg *nats.Msg, cause error) {
	if p.failed {
		return
	}
	p.log.Warn("publish output", "err", cause)
	if err := p.r.publishSync(p.ctx, msg); err != nil {
		p.failed = true
	}
}

// flush waits until every chunk is stored.
func (p *publisher) flush() {
	for len(p.pending) > 0 {
		p.settle()
	}
}
