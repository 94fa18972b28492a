package main

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
)

// TestAddrList: with SBX_ADDR listing a dead coordinator first and a live one second, client
// commands work; a list with an address that is not a URL is refused, naming SBX_ADDR.
func TestAddrList(t *testing.T) {
	s := startServe(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	sbx := func(addr string, args ...string) (string, error) {
		var stdout bytes.Buffer
		getenv := func(k string) string {
			switch k {
			case "SBX_ADDR":
				return addr
			case "SBX_CA_FILE":
				return s.ca
			}
			return ""
		}
		err := run(t.Context(), args, getenv, &stdout, io.Discard)
		return stdout.String(), err
	}
	list := dead + "," + s.addr
	out, err := sbx(list, "run", "--wait", "10s", "--", "echo", "hi")
	if err != nil || out != "hi\n" {
		t.Fatalf("run --wait: %q, %v", out, err)
	}
	if out, err := sbx(list, "ps"); err != nil || !strings.Contains(out, "echo hi") {
		t.Fatalf("ps: %q, %v", out, err)
	}
	if _, err := sbx(dead, "ps"); err == nil || !strings.Contains(err.Error(), "cannot reach") {
		t.Fatalf("ps of a dead coordinator: %v", err)
	}
	if _, err := sbx(s.addr+",127.0.0.1:1", "ps"); err == nil || !strings.Contains(err.Error(), "SBX_ADDR") {
		t.Fatalf("ps with a bad address in the list: %v", err)
	}
}
