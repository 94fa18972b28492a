// Package natstest starts the in-process nats-servers the tests of every package run against: one
// with JetStream (Server, Conn), one of the test's own options (Run), or a cluster (StartCluster).
// It imports nothing of sbx, so that the tests of the runner and of the coordinator can share it.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Run starts a nats-server with opts and waits until it takes connections; it is shut down when t
// ends. Signals are left to the test process.
func Run(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	opts.NoSigs = true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats did not start")
	}
	return ns
}

// Server starts a nats-server on 127.0.0.1 and a port of its own, with JetStream storing in a
// temporary directory, until t ends.
func Server(t testing.TB) *server.Server {
	t.Helper()
	return Run(t, &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir()})
}

// Conn starts a Server and returns a connection to it. Both end when t ends.
func Conn(t testing.TB) *nats.Conn {
	t.Helper()
	return Connect(t, Server(t).ClientURL())
}

// Connect connects to url with opts; the connection is closed when t ends.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
