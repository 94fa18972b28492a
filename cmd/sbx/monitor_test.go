package main

import (
	"strings"
	"testing"
)

// TestMonitorEndToEnd: a monitor's events are its stdout lines only; its stderr is in the output.
func TestMonitorEndToEnd(t *testing.T) {
	s := startServe(t)
	out, err := s.sbx(t, "run", "--session", "mon", "--monitor", "--title", "watch", "--",
		"sh", "-c", `'echo up; echo oops >&2; sleep 0.3; echo ready'`)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	got := s.events(t, "mon", "has finished")
	if !strings.Contains(got, "up") || !strings.Contains(got, "ready") || strings.Contains(got, "oops") {
		t.Fatalf("monitor notifications, want stdout's lines only:\n%s", got)
	}
	logs, err := s.sbx(t, "logs", id)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs, "oops\n") || !strings.Contains(logs, "up\n") {
		t.Fatalf("output %q, want both streams", logs)
	}
}
