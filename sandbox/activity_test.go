package sandbox

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/internal/poll"
)

// awaitActivity polls p.Activity until ok accepts it, failing the test after a deadline.
func awaitActivity(t *testing.T, p *Process, what string, ok func(Activity) bool) Activity {
	t.Helper()
	var a Activity
	if !poll.Within(15*time.Second, func() bool {
		var err error
		if a, err = p.Activity(); err != nil {
			t.Fatal(err)
		}
		return ok(a)
	}) {
		t.Fatalf("never saw %s; last %+v", what, a)
	}
	return a
}

// TestActivityWaitingForInput: a job blocked reading its input — a pipe or a terminal, by read(2)
// or by readline's pselect — waits for input; once answered, it does not.
func TestActivityWaitingForInput(t *testing.T) {
	tests := []struct {
		name   string
		script string
		tty    bool
	}{
		{"read on a pipe", `read x; echo got=$x; sleep 1000`, false},
		{"read on a terminal", `read -p 'name? ' x; echo got=$x; sleep 1000`, true},
		{"python input on a terminal", `python3 -c 'print("got=" + input("name? "))'; sleep 1000`, true},
		{"python input on a pipe", `python3 -c 'print("got=" + input("name? "))'; sleep 1000`, false},
	}
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				spec := bashTTY(fmt.Sprintf("input-%d", i), tt.script, false)
				spec.TTY, spec.Stdin = tt.tty, !tt.tty
				p, err := m.Start(spec)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { p.Kill(); p.Wait() })
				s := watchScreen(p.Output())
				awaitActivity(t, p, "waiting for input", func(a Activity) bool { return a.WaitingForInput })
				if _, err := p.Input().Write([]byte("ann\n")); err != nil {
					t.Fatal(err)
				}
				s.await(t, "got=ann")
				// Now it sleeps: blocked, but not on its input.
				awaitActivity(t, p, "the end of the wait for input", func(a Activity) bool { return !a.WaitingForInput })
			})
		}
	})
}

// TestActivityOtherPipe: a job blocked reading a pipe that is not its input does not wait for
// input, though it is blocked in read(2) on its descriptor 0.
func TestActivityOtherPipe(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		spec := bashTTY("fifo-"+cfg.Version, `exec 3<>`+fifo+`; read x <&3`, false)
		spec.TTY, spec.Stdin = false, true
		p, err := m.Start(spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Kill(); p.Wait() })
		drain(t, p.Output())
		// Wait until bash is blocked in read(2) on its descriptor 0, the fifo.
		var b []byte
		if !poll.Within(10*time.Second, func() bool {
			b, _ = os.ReadFile("/proc/" + strconv.Itoa(p.Pid()) + "/syscall")
			return strings.HasPrefix(string(b), strconv.Itoa(syscall.SYS_READ)+" 0x0 ")
		}) {
			t.Fatalf("bash never blocked reading the fifo: %q", b)
		}
		a, err := p.Activity()
		if err != nil {
			t.Fatal(err)
		}
		if a.WaitingForInput {
			t.Fatal("a read of another pipe counted as waiting for input")
		}
	})
}

// TestActivityReadonlyInput: a readonly job's bwrap processes do not hide that its command waits.
func TestActivityReadonlyInput(t *testing.T) {
	requireReadonly(t)
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		p, err := m.Start(bashTTY("ro-input", `read -p 'ok? ' x; echo got=$x`, true))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Kill(); p.Wait() })
		watchScreen(p.Output())
		awaitActivity(t, p, "waiting for input", func(a Activity) bool { return a.WaitingForInput })
	})
}

// TestActivityListening: the TCP ports a job's processes listen on are listed.
func TestActivityListening(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		m, _ := newTestManager(t, cfg)
		p, err := m.Start(sh("listen", `exec python3 -m http.server 0 --bind 127.0.0.1`))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Kill(); p.Wait() })
		drain(t, p.Output())
		a := awaitActivity(t, p, "a listening port", func(a Activity) bool { return len(a.Listening) > 0 })
		ap := a.Listening[0]
		if ap.Addr() != netip.MustParseAddr("127.0.0.1") || ap.Port() == 0 {
			t.Fatalf("listening on %v", a.Listening)
		}
		c, err := net.Dial("tcp", ap.String())
		if err != nil {
			t.Fatalf("the port listed does not answer: %v", err)
		}
		c.Close()
	})
}

func TestParseProcAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F:1435":                         "127.0.0.1:5173",
		"00000000:0050":                         "0.0.0.0:80",
		"00000000000000000000000000000000:1F90": "[::]:8080",
		"00000000000000000000000001000000:1F90": "[::1]:8080",
		"0000000000000000FFFF00000100007F:0016": "127.0.0.1:22",
	} {
		got, ok := parseProcAddr(in)
		if !ok || got.String() != want {
			t.Errorf("parseProcAddr(%s) = %v, %v; want %s", in, got, ok, want)
		}
	}
	for _, bad := range []string{"", "0100007F", "zz00007F:1435", "0100007F:zz", "0100:0050"} {
		if _, ok := parseProcAddr(bad); ok {
			t.Errorf("parseProcAddr(%q) accepted", bad)
		}
	}
}

// TestActivityWarmReadonly: a readonly job started from a warm init step is known as readonly, as
// a cold one is: the port its command listens on, in bwrap's network namespace that nobody else can
// reach, is not listed.
func TestActivityWarmReadonly(t *testing.T) {
	requireReadonly(t)
	m, _ := newWarmManager(t)
	spec := sh("warm-ro-listen", `exec python3 -c '
import socket, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print("listening", flush=True)
time.sleep(60)
'`)
	spec.Readonly = true
	p, err := m.Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill(); p.Wait() })
	if n := len(m.warm.ready); n != cap(m.warm.ready)-1 {
		t.Fatalf("%d warm init steps ready after the start, want %d: the job did not start warm", n, cap(m.warm.ready)-1)
	}
	s := watchScreen(p.Output())
	s.await(t, "listening")
	a, err := p.Activity()
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Listening) != 0 {
		t.Fatalf("a readonly job's ports are listed: %v", a.Listening)
	}
}

// TestListenDigest: the digest of a /proc/net/tcp table changes when a socket starts listening and
// not with a connection, whatever the order of the lines; a real table reads.
func TestListenDigest(t *testing.T) {
	const header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	const (
		listen1 = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0000000000000000 100 0 0 10 0\n"
		listen2 = "   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1002 1 0000000000000000 100 0 0 10 0\n"
		conn    = "   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 1003 1 0000000000000000 20 4 30 10 -1\n"
	)
	sum := func(lines ...string) uint64 {
		t.Helper()
		d, err := listenSum(strings.NewReader(header + strings.Join(lines, "")))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	one, two := sum(listen1), sum(listen1, listen2)
	if one == two {
		t.Errorf("digest %x did not change with a second listening socket", one)
	}
	if got := sum(listen2, conn, listen1); got != two {
		t.Errorf("digest %x with a connection and the lines reordered, want %x", got, two)
	}
	if _, err := ListenDigest(); err != nil {
		t.Fatal(err)
	}
}
