package coordinatortest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// StartNATS starts an in-process nats-server on 127.0.0.1 with JetStream storing in a temporary
// directory, and returns a connection to it. Both end when t ends.
func StartNATS(t testing.TB) *nats.Conn {
	t.Helper()
	_, nc := StartServer(t)
	return nc
}

// StartServer is StartNATS for a test that also acts on the server itself.
func StartServer(t testing.TB) (*server.Server, *nats.Conn) {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats did not start")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return ns, nc
}
