package main

import (
	"encoding/json"
	"net"
	"regexp"
	"strings"
	"testing"

	"github.com/sbx-dev/sbx/coordinator/client"
)

// TestTTYEndToEnd: a tty job shows read -p's prompt (bash prints none without a terminal), gets
// one stall notification once the runner sees it waiting for input, and takes its answer from
// sbx send; python's input() works the same; a resize reaches the job as SIGWINCH and stty.
func TestTTYEndToEnd(t *testing.T) {
	s := startServe(t, "--input-stall-after", "1s")
	out, err := s.sbx(t, "run", "--tty", "--session", "tty", "--title", "confirm", "--", `read -p 'Continue? (y/n) ' x; echo got=$x`)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	if out, err := s.sbx(t, "wait", "--timeout", "20s", "--pattern", `Continue\? \(y/n\) $`, id); err != nil || out != "Continue? (y/n) \n" {
		t.Fatalf("wait for the prompt: %q, %v", out, err)
	}
	got := s.events(t, "tty", "is waiting for input")
	if !strings.Contains(got, "detail: The command is waiting for input: all its processes have been blocked reading its terminal for ") ||
		!strings.Contains(got, "  Continue? (y/n)\n") || !strings.Contains(got, "sbx send "+id+" TEXT") {
		t.Fatalf("stall notification:\n%s", got)
	}
	if _, err := s.sbx(t, "send", id, "y"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.sbx(t, "wait", "--timeout", "20s", id); err != nil {
		t.Fatalf("wait: %v", err)
	}
	if out, _ := s.sbx(t, "logs", id); out != "Continue? (y/n) y\r\ngot=y\r\n" {
		t.Fatalf("logs %q", out)
	}

	out, err = s.sbx(t, "run", "--tty", "--", `python3 -c 'print("got", input("name? "))'`)
	if err != nil {
		t.Fatal(err)
	}
	id = strings.TrimSpace(out)
	if _, err := s.sbx(t, "wait", "--timeout", "20s", "--pattern", `name\? `, id); err != nil {
		t.Fatal(err)
	}
	if _, err := s.sbx(t, "send", id, "ann"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.sbx(t, "wait", "--timeout", "20s", id); err != nil {
		t.Fatalf("wait: %v", err)
	}
	if out, _ := s.sbx(t, "logs", id); !strings.Contains(out, "got ann\r\n") {
		t.Fatalf("logs %q", out)
	}

	reply, err := s.c.Start(t.Context(), client.StartRequest{Cwd: "/", TTY: true, TTYSize: &client.TTYSize{Rows: 30, Cols: 100},
		Command: `trap 'echo "winch $(stty size)"; exit 0' WINCH; echo "size $(stty size)"; while :; do sleep 0.05; done`})
	if err != nil {
		t.Fatal(err)
	}
	id = reply.Job.ID
	if _, err := s.sbx(t, "wait", "--timeout", "20s", "--pattern", "size 30 100", id); err != nil {
		t.Fatal(err)
	}
	j, err := s.c.Resize(t.Context(), id, client.TTYSize{Rows: 50, Cols: 132})
	if err != nil || j.TTYSize == nil || *j.TTYSize != (client.TTYSize{Rows: 50, Cols: 132}) {
		t.Fatalf("resize: %+v, %v", j, err)
	}
	if _, err := s.sbx(t, "wait", "--timeout", "20s", id); err != nil {
		t.Fatalf("wait: %v", err)
	}
	if out, _ := s.sbx(t, "logs", id); !strings.Contains(out, "winch 50 132") {
		t.Fatalf("logs %q", out)
	}
	if _, err := s.c.Resize(t.Context(), id, client.TTYSize{Rows: 50, Cols: 132}); err == nil || !strings.Contains(err.Error(), "ended") {
		t.Fatalf("resize of an ended job: %v", err)
	}
}

// TestPortEndToEnd: a job that listens gets its port in the job object, one port notification,
// and sbx wait --port returns with the address.
func TestPortEndToEnd(t *testing.T) {
	s := startServe(t)
	out, err := s.sbx(t, "run", "--session", "ports", "--title", "web", "--", "exec python3 -m http.server 0 --bind 127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	t.Cleanup(func() { s.sbx(t, "kill", id) })
	addr, err := s.sbx(t, "wait", "--timeout", "30s", "--port", "any", id)
	if err != nil {
		t.Fatal(err)
	}
	addr = strings.TrimSpace(addr)
	if !regexp.MustCompile(`^127\.0\.0\.1:\d+$`).MatchString(addr) {
		t.Fatalf("wait --port printed %q", addr)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("the port waited for does not answer: %v", err)
	}
	c.Close()
	_, port, _ := net.SplitHostPort(addr)
	if out, err := s.sbx(t, "wait", "--timeout", "5s", "--port", port, id); err != nil || strings.TrimSpace(out) != addr {
		t.Fatalf("wait --port %s: %q, %v", port, out, err)
	}
	raw, err := s.sbx(t, "status", "--json", id)
	if err != nil {
		t.Fatal(err)
	}
	var j client.Job
	if err := json.Unmarshal([]byte(raw), &j); err != nil {
		t.Fatal(err)
	}
	if len(j.Ports) != 1 || net.JoinHostPort(j.Ports[0].Address, port) != addr {
		t.Fatalf("job ports %+v", j.Ports)
	}
	if out, err := s.sbx(t, "status", id); err != nil || !strings.Contains(out, "listening: "+addr+"\n") {
		t.Fatalf("status: %q, %v", out, err)
	}
	got := s.events(t, "ports", "detail: listening on "+addr+"\n")
	if strings.Count(got, "listening on") != 1 {
		t.Fatalf("port notifications:\n%s", got)
	}
	if _, err := s.sbx(t, "wait", "--port", "http", id); code(err) != 2 {
		t.Fatalf("wait --port http: %v (exit %d)", err, code(err))
	}
}
