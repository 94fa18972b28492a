package httpapi

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"
)

// Handoff lets the Servers of one process take turns on one listening socket: a standby's
// forwarder, then, once the process leads, its API. Each Listener stops accepting when it is
// closed but leaves the socket open, so that the address never stops taking connections: those
// that arrive in between wait in the kernel's backlog for the next Listener.
type Handoff struct {
	ln *net.TCPListener

	// accepting is held by the one listener inside the socket's Accept, so that the next waits
	// until the previous has seen its Close.
	accepting sync.Mutex

	mu      sync.Mutex
	cur     *handoffListener
	pending []net.Conn // accepted as a listener closed: the next one serves them
}

// NewHandoff takes ln, a TCP listener; closing it stays the caller's job.
func NewHandoff(ln net.Listener) (*Handoff, error) {
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		return nil, fmt.Errorf("handoff: %T is not a TCP listener", ln)
	}
	return &Handoff{ln: tl}, nil
}

// Listener returns the socket's listener for the next Server. The previous one must be closed
// first; connections it accepted as it closed are the new one's first.
func (h *Handoff) Listener() (net.Listener, error) {
	h.mu.Lock()
	open := h.cur != nil && !h.cur.closed
	h.mu.Unlock()
	if open {
		return nil, errors.New("handoff: the previous listener is still open")
	}
	// The previous Close woke its Accept with a deadline in the past: once it is out, lift it.
	h.accepting.Lock()
	defer h.accepting.Unlock()
	if err := h.ln.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	l := &handoffListener{h: h}
	h.mu.Lock()
	h.cur = l
	h.mu.Unlock()
	return l, nil
}

type handoffListener struct {
	h      *Handoff
	closed bool // guarded by h.mu
}

func (l *handoffListener) isClosed() bool {
	l.h.mu.Lock()
	defer l.h.mu.Unlock()
	return l.closed
}

// Accept returns the socket's next connection until Close.
func (l *handoffListener) Accept() (net.Conn, error) {
	l.h.accepting.Lock()
	defer l.h.accepting.Unlock()
	for {
		if l.isClosed() {
			return nil, net.ErrClosed
		}
		if c := l.h.takePending(); c != nil {
			return c, nil
		}
		c, err := l.h.ln.Accept()
		if l.isClosed() {
			if c != nil {
				l.h.keep(c) // accepted in the instant of the Close: the next listener serves it
			}
			return nil, net.ErrClosed
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue // a deadline set for the listener before this one
		}
		return c, err
	}
}

// Close makes Accept return net.ErrClosed, leaving the socket open. Only the first Close acts:
// http.Server closes its listener again as its Serve returns, by when the next listener may be
// accepting.
func (l *handoffListener) Close() error {
	l.h.mu.Lock()
	defer l.h.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	return l.h.ln.SetDeadline(time.Now())
}

func (l *handoffListener) Addr() net.Addr { return l.h.ln.Addr() }

func (h *Handoff) keep(c net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pending = append(h.pending, c)
}

func (h *Handoff) takePending() net.Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.pending) == 0 {
		return nil
	}
	c := h.pending[0]
	h.pending = h.pending[1:]
	return c
}
