package main

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/internal/natstest"
)

// TestReplicasFlag: serve, whose embedded NATS is one server, takes no --replicas but 1, and
// neither command takes less than 1: usage errors (exit 2) naming the flag, before anything starts.
func TestReplicasFlag(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--replicas", "3"},
		{"serve", "--replicas", "0"},
		{"coordinator", "--nats", "nats://127.0.0.1:1", "--replicas", "0"},
	} {
		full := append(args, "--listen", "127.0.0.1:0", "--data", t.TempDir())
		if err := run(t.Context(), full, os.Getenv, io.Discard, io.Discard); code(err) != 2 || !strings.Contains(err.Error(), "--replicas") {
			t.Errorf("sbx %s: exit %d (%v), want 2 naming --replicas", strings.Join(args, " "), code(err), err)
		}
	}
}

// TestCoordinatorReplicasSingleServer: a coordinator asked for 3 replicas on a NATS that is a single
// server exits with an error naming the stream and the cause, rather than waiting for JetStream
// for ever. The context only bounds a coordinator that would wait: it returns nil then.
func TestCoordinatorReplicasSingleServer(t *testing.T) {
	ns := natstest.Server(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := run(ctx, []string{"coordinator", "--nats", ns.ClientURL(), "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--replicas", "3"}, os.Getenv, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "stream KV_SBX_LEASE with 3 replicas: NATS is a single server, not a cluster") {
		t.Fatalf("coordinator --replicas 3 on one server: %v; want an error naming the lease bucket (the first made) and the missing cluster", err)
	}
}
