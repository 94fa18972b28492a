package natstest

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/internal/poll"
)

// Cluster is a NATS cluster of in-process servers with JetStream, each storing in its own temporary
// directory, for the tests of what must survive the loss of a server.
type Cluster struct {
	Servers []*server.Server
}

// StartCluster starts a cluster of n servers named s1…sn on 127.0.0.1 and waits until its
// JetStream meta group has a leader and knows all n peers. The servers are shut down when t ends.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	// Every server is given the routes to all (its own is ignored): JetStream sizes its meta group by
	// the routes configured, so a server told of only one other would count a cluster of two. The
	// route ports must therefore be known before any server starts.
	ports := freePorts(t, n)
	routes := make([]string, n)
	for i, p := range ports {
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", p)
	}
	c := &Cluster{}
	for i, p := range ports {
		c.Servers = append(c.Servers, Run(t, &server.Options{
			ServerName: fmt.Sprintf("s%d", i+1), Host: "127.0.0.1", Port: -1,
			JetStream: true, StoreDir: t.TempDir(),
			Cluster: server.ClusterOpts{Name: "sbx-test", Host: "127.0.0.1", Port: p},
			Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
		}))
	}
	poll.Until(t, 30*time.Second, fmt.Sprintf("the JetStream cluster of %d servers forms", n), func() bool { return c.ready(n) })
	return c
}

// ready reports whether the running servers' meta group has a leader that knows n peers, and every
// running server is current with it.
func (c *Cluster) ready(n int) bool {
	leader := false
	for _, ns := range c.Servers {
		if !ns.Running() {
			continue
		}
		if !ns.JetStreamIsCurrent() {
			return false
		}
		if ns.JetStreamIsLeader() {
			leader = len(ns.JetStreamClusterPeers()) == n
		}
	}
	return leader
}

// URLs are the client URLs of all servers, comma-separated as nats.Connect takes them: a client
// connected with them moves to another server when its own shuts down.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.Servers))
	for i, ns := range c.Servers {
		urls[i] = ns.ClientURL()
	}
	return strings.Join(urls, ",")
}

// Server returns the server named name (s1…sn), or nil.
func (c *Cluster) Server(name string) *server.Server {
	for _, ns := range c.Servers {
		if ns.Name() == name {
			return ns
		}
	}
	return nil
}

// freePorts returns n distinct ports of 127.0.0.1 that were free a moment ago: each is held until
// all are picked, so that they differ, and released for the servers to bind.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// ShutdownLeader shuts down the server leading stream (as its info says now) and returns it.
func (c *Cluster) ShutdownLeader(t testing.TB, stream jetstream.Stream) *server.Server {
	t.Helper()
	info, err := stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	leader := c.Server(info.Cluster.Leader)
	if leader == nil {
		t.Fatalf("stream %s's leader %q is none of the cluster's servers", info.Config.Name, info.Cluster.Leader)
	}
	leader.Shutdown()
	leader.WaitForShutdown()
	return leader
}
