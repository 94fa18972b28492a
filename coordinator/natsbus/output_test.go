package natsbus

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/store"
	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/internal/poll"
	"github.com/sbx-dev/sbx/proto"
)

// openOutput opens an Output on nc over terminal files in a new directory.
func openOutput(t testing.TB, nc *nats.Conn) (*Output, *store.Terminals) {
	t.Helper()
	files, err := store.OpenTerminals(filepath.Join(t.TempDir(), "terminals"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { files.Close() })
	o, err := OpenOutput(t.Context(), nc, files, OutputConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return o, files
}

// testJob is a started job whose terminal file has its header.
func testJob(t testing.TB, o *Output, id string) *coordinator.Job {
	t.Helper()
	started := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	j := &coordinator.Job{ID: id, Command: "yes | head", Cwd: "/", Status: coordinator.StatusRunning, Pid: 42, CreatedAt: started, StartedAt: &started}
	if err := o.Begin(j); err != nil {
		t.Fatal(err)
	}
	return j
}

// body is n bytes of output that no two offsets confuse.
func body(n int) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	return b.Bytes()[:n]
}

// writeChunks writes data in chunks of size, the chunk at swap written after the one that follows
// it (an event applied out of turn), and flushes.
func writeChunks(t testing.TB, o *Output, id string, data []byte, size, swap int) {
	t.Helper()
	var offs []int
	for off := 0; off < len(data); off += size {
		offs = append(offs, off)
	}
	if swap+1 < len(offs) {
		offs[swap], offs[swap+1] = offs[swap+1], offs[swap]
	}
	for _, off := range offs {
		if err := o.Write(id, int64(off), data[off:min(off+size, len(data))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func readAll(t testing.TB, o *Output, id string, offset, limit int64) []byte {
	t.Helper()
	rc, err := o.Open(id, offset, limit)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s [%d, +%d): %v", id, offset, limit, err)
	}
	return b
}

// TestOutputWithoutFiles: the stream serves a job's output byte-exact once its terminal file is
// gone, whole or from any offset, chunks stored out of turn included.
func TestOutputWithoutFiles(t *testing.T) {
	nc := natstest.Conn(t)
	o, files := openOutput(t, nc)
	testJob(t, o, "j1")
	data := body(300_000)
	writeChunks(t, o, "j1", data, 7_000, 3)
	if got := readAll(t, o, "j1", 0, int64(len(data))); !bytes.Equal(got, data) {
		t.Fatal("the file does not give the bytes written")
	}
	if err := files.Remove("j1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(files.Path("j1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the file is still there: %v", err)
	}
	for _, r := range []struct{ off, limit int64 }{{0, int64(len(data))}, {0, -1}, {21_000, 7_000}, {20_999, 7_002}, {1, 1}, {299_000, 1_000}, {150_001, -1}} {
		end := int64(len(data))
		if r.limit >= 0 {
			end = r.off + r.limit
		}
		if got := readAll(t, o, "j1", r.off, r.limit); !bytes.Equal(got, data[r.off:end]) {
			t.Fatalf("from the stream, [%d, +%d): %d bytes, not the %d written", r.off, r.limit, len(got), end-r.off)
		}
	}
	// A read past what the stream holds fails rather than give less.
	rc, err := o.Open("j1", 299_000, 2_000)
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	if err == nil {
		t.Fatal("a read past the stored output succeeded")
	}
	if got := readAll(t, o, "nothing", 0, -1); len(got) != 0 {
		t.Fatalf("a job without output reads %q", got)
	}
	// Reads closed leave no consumer behind.
	info, err := o.stream.Info(t.Context())
	if err != nil || info.State.Consumers != 0 {
		t.Fatalf("%+v consumers on the output stream after the reads (%v)", info.State.Consumers, err)
	}
}

// TestOutputSync: Sync makes a terminal file identical to the one the job's coordinator wrote,
// header, body and footer, for an ended job whose file is gone, and completes the file of a running
// job that stops short.
func TestOutputSync(t *testing.T) {
	nc := natstest.Conn(t)
	o, files := openOutput(t, nc)
	ended := testJob(t, o, "ended")
	data := body(100_000)
	writeChunks(t, o, "ended", data, 4_096, 5)
	at, code := ended.StartedAt.Add(1500*time.Millisecond), 0
	ended.Status, ended.EndedAt, ended.ExitCode, ended.OutputBytes = coordinator.StatusSucceeded, &at, &code, int64(len(data))
	if err := o.End(ended); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(files.Path("ended"))
	if err != nil {
		t.Fatal(err)
	}
	running := testJob(t, o, "running")
	writeChunks(t, o, "running", data, 4_096, 0)
	wantRunning, err := os.ReadFile(files.Path("running"))
	if err != nil {
		t.Fatal(err)
	}

	// Another coordinator's files: none for the ended job, the running one's cut short.
	other, err := store.OpenTerminals(filepath.Join(t.TempDir(), "terminals"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Begin(running); err != nil {
		t.Fatal(err)
	}
	if err := other.Write("running", 0, data[:10_000]); err != nil {
		t.Fatal(err)
	}
	taker, err := OpenOutput(t.Context(), nc, other, OutputConfig{})
	if err != nil {
		t.Fatal(err)
	}
	queued := &coordinator.Job{ID: "queued", Status: coordinator.StatusQueued, CreatedAt: time.Now()}
	if err := taker.Sync(t.Context(), []*coordinator.Job{ended, running, queued}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(other.Path("ended")); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the ended job's file, synced (%v):\n%.400s\nwant:\n%.400s", err, got, want)
	}
	if got, err := os.ReadFile(other.Path("running")); err != nil || !bytes.Equal(got, wantRunning) {
		t.Fatalf("the running job's file, synced: %d bytes (%v), want %d", len(got), err, len(wantRunning))
	}
	if _, err := os.Stat(other.Path("queued")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a queued job got a file: %v", err)
	}
}

// storedChunks is the number of chunks the stream holds for a job.
func storedChunks(t testing.TB, o *Output, id string) uint64 {
	t.Helper()
	info, err := o.stream.Info(t.Context(), jetstream.WithSubjectFilter(proto.JobOutputSubject(id)))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[proto.JobOutputSubject(id)]
}

// TestOutputDuplicateAndRemove: a chunk written again (its event redelivered) is stored once, and
// Remove purges the job's chunks and its file, not another job's.
func TestOutputDuplicateAndRemove(t *testing.T) {
	nc := natstest.Conn(t)
	o, files := openOutput(t, nc)
	testJob(t, o, "j1")
	testJob(t, o, "j2")
	for range 2 {
		writeChunks(t, o, "j1", []byte("hello\n"), 6, 0)
	}
	writeChunks(t, o, "j2", []byte("other\n"), 6, 0)
	if n := storedChunks(t, o, "j1"); n != 1 {
		t.Fatalf("a chunk written twice is stored %d times", n)
	}
	if err := o.Remove("j1"); err != nil {
		t.Fatal(err)
	}
	if n := storedChunks(t, o, "j1"); n != 0 {
		t.Fatalf("%d chunks left after Remove", n)
	}
	if _, err := os.Stat(files.Path("j1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the file is left after Remove: %v", err)
	}
	if n := storedChunks(t, o, "j2"); n != 1 {
		t.Fatalf("Remove of j1 left j2 %d chunks", n)
	}
}

// TestOutputStreamTakesOnlyOutput: a runner cannot store anything in the output stream, not even
// by aiming the event stream's acknowledgement of its publish at a job's output subject.
func TestOutputStreamTakesOnlyOutput(t *testing.T) {
	nc := natstest.Conn(t)
	c := startCoordinator(t, nc, t.TempDir())
	ctx := t.Context()
	rc := connectRunner(t, nc, "r1")
	trap := proto.JobOutputSubject("j1")
	if err := rc.PublishRequest(proto.OutputSubject("r1", "j1"), trap, []byte("forged")); err != nil {
		t.Fatal(err)
	}
	// The event stream answers in order: once the second publish is acknowledged, the first
	// acknowledgement went out.
	rjs, err := jetstream.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rjs.Publish(ctx, proto.StateSubject("r1", "j2"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.out.stream.GetLastMsgForSubject(ctx, trap); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("an acknowledgement was stored as output on %s: %v", trap, err)
	}
}

// TestEventsAckedAfterOutputStored: the event that carried a chunk is acked only once the output
// stream stored the chunk. While the stream is gone the chunk's event stays in the event stream,
// and once the stream is back the chunk is stored and the event acked.
func TestEventsAckedAfterOutputStored(t *testing.T) {
	nc := natstest.Conn(t)
	c := startCoordinator(t, nc, t.TempDir())
	ctx := t.Context()
	js, _ := jetstream.New(nc)
	id, r := startedJob(t, c.svc, js)
	r.chunk(id, 0, "kept\n")
	if w, err := c.svc.Wait(ctx, id, 5*time.Second, mustCompile(t, "kept")); err != nil || !w.PatternMatched {
		t.Fatalf("the output was not applied: %+v %v", w, err)
	}
	waitEvents(t, c.bus, 0)
	if n := storedChunks(t, c.out, id); n != 1 {
		t.Fatalf("%d chunks stored, want 1", n)
	}

	cfg := c.out.stream.CachedInfo().Config
	if err := js.DeleteStream(ctx, proto.OutputStream); err != nil {
		t.Fatal(err)
	}
	r.chunk(id, 5, "lost?\n")
	// The chunk is applied (its file written) but not stored: its event stays.
	var b []byte
	var err error
	if !poll.Within(10*time.Second, func() bool {
		b, err = os.ReadFile(c.out.Path(id))
		return err == nil && bytes.Contains(b, []byte("lost?"))
	}) {
		t.Fatalf("the second chunk was never applied: %q %v", b, err)
	}
	if n := eventsLeft(t, c.bus); n != 1 {
		t.Fatalf("%d events in the event stream while the output stream is gone, want the chunk's", n)
	}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	waitEvents(t, c.bus, 0)
	if got := readStream(t, c.out, id); got != "lost?\n" {
		t.Fatalf("the stream holds %q after it came back, want the chunk applied again", got)
	}
}

func eventsLeft(t testing.TB, b *Bus) uint64 {
	t.Helper()
	info, err := b.events.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// waitEvents waits until the event stream holds n events (acked ones leave it).
func waitEvents(t testing.TB, b *Bus, n uint64) {
	t.Helper()
	if !poll.Within(10*time.Second, func() bool { return eventsLeft(t, b) == n }) {
		t.Fatalf("the event stream holds %d events, want %d", eventsLeft(t, b), n)
	}
}

// readStream returns the job's chunks in the stream, concatenated in stream order.
func readStream(t testing.TB, o *Output, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	cons, err := o.js.OrderedConsumer(ctx, proto.OutputStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{proto.JobOutputSubject(id)}})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.FetchNoWait(100)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for m := range batch.Messages() {
		b.Write(m.Data())
	}
	return b.String()
}

// BenchmarkOutputWrite measures output written in full chunks into the terminal file alone (files)
// and through Output (output: the stream and the file, flushed every ackBatch chunks as the event
// consumer does).
func BenchmarkOutputWrite(b *testing.B) {
	nc := natstest.Conn(b)
	o, files := openOutput(b, nc)
	chunk := body(proto.MaxChunkBytes)
	for _, bc := range []struct {
		name  string
		write func(id string, off int64) error
		flush func() error
	}{
		{"files", func(id string, off int64) error { return files.Write(id, off, chunk) }, func() error { return nil }},
		{"output", func(id string, off int64) error { return o.Write(id, off, chunk) }, func() error { return o.Flush(b.Context()) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			id := "bench-" + bc.name
			testJob(b, o, id)
			b.SetBytes(int64(len(chunk)))
			var off int64
			for i := 0; b.Loop(); i++ {
				if err := bc.write(id, off); err != nil {
					b.Fatal(err)
				}
				off += int64(len(chunk))
				if (i+1)%ackBatch == 0 {
					if err := bc.flush(); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := bc.flush(); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if err := o.Remove(id); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestServiceOutputWithoutFile: the coordinator serves an ended job's output byte-exact once its
// terminal file is gone, from the stream.
func TestServiceOutputWithoutFile(t *testing.T) {
	nc := natstest.Conn(t)
	c := startCoordinator(t, nc, t.TempDir())
	ctx := t.Context()
	js, _ := jetstream.New(nc)
	id, r := startedJob(t, c.svc, js)
	data := body(3 * proto.MaxChunkBytes / 2)
	r.chunk(id, 0, string(data[:proto.MaxChunkBytes]))
	r.chunk(id, proto.MaxChunkBytes, string(data[proto.MaxChunkBytes:]))
	code := 0
	r.event(&proto.Event{Kind: proto.EventExited, JobID: id, ExitCode: &code, Reason: proto.ReasonExit, OutputBytes: int64(len(data))})
	if w, err := c.svc.Wait(ctx, id, 10*time.Second, nil); err != nil || !w.Done {
		t.Fatalf("the job did not end: %+v %v", w, err)
	}
	waitEvents(t, c.bus, 0)
	if err := os.Remove(c.out.Path(id)); err != nil {
		t.Fatal(err)
	}
	rc, size, err := c.svc.Output(ctx, id, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil || size != int64(len(data)) || !bytes.Equal(got, data) {
		t.Fatalf("output without its file: %d of %d bytes (%v), byte-exact %v", len(got), size, err, bytes.Equal(got, data))
	}
}
