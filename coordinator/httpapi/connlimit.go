package httpapi

import (
	"net"
	"sync"
	"sync/atomic"
)

// Default connection bounds (Config.MaxConns, Config.MaxConnsPerClient). Every connection costs a
// file descriptor, which the process shares with the embedded NATS server, its JetStream files
// and the store: without a bound, a client holding tens of thousands of idle keep-alives takes
// every descriptor, and JetStream fails with "too many open files".
const (
	DefaultMaxConns          = 4096
	DefaultMaxConnsPerClient = 1024
)

// limitListener accepts at most max connections at a time, and at most perClient from one client
// address (its IP; the port changes with every connection). A connection past either bound is
// closed as soon as it is accepted, so that one client cannot make the others wait: it sees its
// connection close before any reply.
type limitListener struct {
	net.Listener
	max, perClient int

	mu      sync.Mutex
	total   int
	clients map[string]int
	refused atomic.Int64
}

func newLimitListener(ln net.Listener, max, perClient int) *limitListener {
	return &limitListener{Listener: ln, max: max, perClient: perClient, clients: map[string]int{}}
}

// Accept returns the next connection within the bounds, closing those past them.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client := clientOf(c.RemoteAddr())
		if l.take(client) {
			return &limitedConn{Conn: c, release: func() { l.release(client) }}, nil
		}
		l.refused.Add(1)
		c.Close()
	}
}

func (l *limitListener) take(client string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.total >= l.max || l.clients[client] >= l.perClient {
		return false
	}
	l.total++
	l.clients[client]++
	return true
}

func (l *limitListener) release(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.clients[client]--; l.clients[client] <= 0 {
		delete(l.clients, client)
	}
}

// counts returns the connections open and those refused so far.
func (l *limitListener) counts() (open int, refused int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, l.refused.Load()
}

// clientOf is the address a connection counts against: its IP, or the whole address when it has
// no port (a Unix socket's).
func clientOf(a net.Addr) string {
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}

// limitedConn gives its slot back when it is closed, once: net/http may close a connection twice.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
