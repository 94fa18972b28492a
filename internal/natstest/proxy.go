package natstest

import (
	"net"
	"sync"
	"testing"
)

// StallProxy forwards TCP connections to a NATS server and can hold every byte in both directions,
// as a stalled runner (SIGSTOP, a frozen VM) or a cut network looks to the others: nothing is
// closed, nothing gets through.
type StallProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	// up and down are closed while bytes flow to the server and back from it.
	up, down chan struct{}
}

// NewStallProxy starts a StallProxy to target (host:port) that lets every byte through until
// told otherwise; it closes its connections when t ends.
func NewStallProxy(t testing.TB, target string) *StallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &StallProxy{ln: ln, target: target, up: make(chan struct{}), down: make(chan struct{})}
	close(p.up)
	close(p.down)
	var wg sync.WaitGroup
	var conns []net.Conn
	var connsMu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			connsMu.Lock()
			conns = append(conns, c, up)
			connsMu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); p.pipe(up, c, &p.up) }()
			go func() { defer wg.Done(); p.pipe(c, up, &p.down) }()
		}
	}()
	t.Cleanup(func() {
		p.Resume()
		ln.Close()
		connsMu.Lock()
		for _, c := range conns {
			c.Close()
		}
		connsMu.Unlock()
		wg.Wait()
	})
	return p
}

// URL is the proxy's NATS URL.
func (p *StallProxy) URL() string { return "nats://" + p.ln.Addr().String() }

// pipe copies src to dst, holding what it read while the gate is shut.
func (p *StallProxy) pipe(dst, src net.Conn, gate *chan struct{}) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			open := *gate
			p.mu.Unlock()
			<-open
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Stall holds every byte both ways.
func (p *StallProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.up, p.down = make(chan struct{}), make(chan struct{})
}

// StallReplies holds what the server sends: what the client publishes is delivered, and it hears
// nothing back, acks included.
func (p *StallProxy) StallReplies() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = make(chan struct{})
}

// Resume lets every byte through again, what was held first.
func (p *StallProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, g := range []chan struct{}{p.up, p.down} {
		select {
		case <-g:
		default:
			close(g)
		}
	}
}
