package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/sbx-dev/sbx/proto"
	"github.com/sbx-dev/sbx/sandbox"
)

// process is what the runner needs of a started job: a *sandbox.Process, or a wsSource for a job
// whose output is a WebSocket's messages.
type process interface {
	Pid() int
	Output() io.Reader
	Errors() io.Reader
	Input() *os.File
	Signal(syscall.Signal) error
	Kill() error
	Wait() (sandbox.Result, error)
	Ended() <-chan struct{}
	Result() sandbox.Result
	Stages() sandbox.Stages
}

var (
	_ process = (*sandbox.Process)(nil)
	_ process = (*wsSource)(nil)
)

// sourceDialTimeout bounds the opening handshake of a WebSocket source.
const sourceDialTimeout = 10 * time.Second

// wsSource is a job that runs no process: the runner reads a WebSocket, which lives where a
// command would (the runner's network, not the coordinator's), and each message becomes output
// lines. The server's close ends it (exit 0 for a normal close, 1 otherwise, with a last line saying
// how it closed); a kill or timeout closes it (exit 143, as a TERMed shell's).
type wsSource struct {
	out    *io.PipeReader
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	killed bool
	res    sandbox.Result
}

// dialSource opens the job's WebSocket and starts reading it.
func dialSource(src *proto.Source) (*wsSource, error) {
	ctx, cancel := context.WithCancel(context.Background())
	dctx, dcancel := context.WithTimeout(ctx, sourceDialTimeout)
	defer dcancel()
	conn, _, err := websocket.Dial(dctx, src.WS, nil)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("connect to %s: %w", src.WS, err)
	}
	// A message is output lines: one larger than a chunk ends the source rather than fill memory.
	conn.SetReadLimit(proto.MaxChunkBytes)
	pr, pw := io.Pipe()
	s := &wsSource{out: pr, cancel: cancel, done: make(chan struct{})}
	go s.read(ctx, conn, pw)
	return s, nil
}

// read copies each message into the output until the socket closes or the job is killed. A write
// waits for the output to be read: a job's output is never dropped, so a slow publish slows the
// reading of the socket.
func (s *wsSource) read(ctx context.Context, conn *websocket.Conn, pw *io.PipeWriter) {
	defer close(s.done)
	defer s.cancel()
	var err error
	for {
		var data []byte
		if _, data, err = conn.Read(ctx); err != nil {
			break
		}
		if len(data) == 0 || data[len(data)-1] != '\n' {
			data = append(data, '\n')
		}
		if _, err = pw.Write(data); err != nil {
			break
		}
	}
	s.mu.Lock()
	killed := s.killed
	s.mu.Unlock()
	var last string
	var ce websocket.CloseError
	switch {
	case killed:
		_ = conn.Close(websocket.StatusGoingAway, "job stopped")
		s.res = sandbox.Result{ExitCode: 128 + int(syscall.SIGTERM), Signal: int(syscall.SIGTERM)}
	case errors.As(err, &ce):
		last = fmt.Sprintf("[WebSocket closed: %d %s]\n", int(ce.Code), ce.Reason)
		if ce.Code != websocket.StatusNormalClosure && ce.Code != websocket.StatusGoingAway {
			s.res.ExitCode = 1
		}
	default:
		last = fmt.Sprintf("[WebSocket failed: %v]\n", err)
		s.res.ExitCode = 1
	}
	if last != "" {
		_, _ = pw.Write([]byte(last))
	}
	conn.CloseNow()
	pw.Close()
}

// Pid is 0: there is no process.
func (s *wsSource) Pid() int { return 0 }

// Stages are none: the source has no cgroup and executes nothing.
func (s *wsSource) Stages() sandbox.Stages { return sandbox.Stages{} }

// Output is the messages, one line each at least.
func (s *wsSource) Output() io.Reader { return s.out }

// Errors is nil: a WebSocket has one stream.
func (s *wsSource) Errors() io.Reader { return nil }

// Input is nil: a source takes no input.
func (s *wsSource) Input() *os.File { return nil }

// Signal closes the socket for the signals that stop a job; others mean nothing to a socket.
func (s *wsSource) Signal(sig syscall.Signal) error {
	switch sig {
	case syscall.SIGTERM, syscall.SIGKILL, syscall.SIGINT, syscall.SIGHUP:
		return s.Kill()
	}
	return fmt.Errorf("a WebSocket source takes no %s", sig)
}

// Kill closes the socket.
func (s *wsSource) Kill() error {
	s.mu.Lock()
	s.killed = true
	s.mu.Unlock()
	s.cancel()
	return nil
}

// Wait waits until the socket is closed and its last line written.
func (s *wsSource) Wait() (sandbox.Result, error) {
	<-s.done
	return s.res, nil
}

// Ended is closed when Wait returns: a socket has nothing to clean up after.
func (s *wsSource) Ended() <-chan struct{} { return s.done }

// Result is Wait's result, once Ended is closed.
func (s *wsSource) Result() sandbox.Result {
	<-s.done
	return s.res
}
