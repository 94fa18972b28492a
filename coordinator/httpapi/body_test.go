package httpapi_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/httpapi"
)

// TestBodyTimeout: a client that sends its headers and part of its body gets an answer within the
// body timeout, and its connection is closed, on every route: routes that read their body, routes
// that ignore it, refusals, unknown paths. Before the fix none of these was ever answered: net/http
// drains an unread body before it sends the reply, and nothing bounded that drain.
func TestBodyTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	h := newHarness(t, httpapi.Config{Token: "t", BodyTimeout: timeout})
	h.startOnly()
	id := h.start(map[string]any{"command": "sleep 100"}, "Authorization", "Bearer t").Job.ID
	auth := "Authorization: Bearer t\r\nContent-Type: application/json\r\n"
	tests := []struct {
		name, head string
		status     int
	}{
		{"start", "POST /v1/jobs HTTP/1.1\r\n" + auth + "Content-Length: 100\r\n\r\n{\"command\":", 408},
		{"complete JSON, more announced", "POST /v1/jobs HTTP/1.1\r\n" + auth + "Content-Length: 100\r\n\r\n{}", 408},
		{"chunked", "POST /v1/notifications/ack HTTP/1.1\r\n" + auth + "Transfer-Encoding: chunked\r\n\r\n5\r\n{\"seq", 408},
		{"kill", "POST /v1/jobs/" + id + "/kill HTTP/1.1\r\n" + auth + "Content-Length: 100\r\n\r\n{", 408},
		{"stdin", "POST /v1/jobs/" + id + "/stdin HTTP/1.1\r\n" + auth + "Content-Length: 100\r\n\r\n{\"data\":", 408},
		{"sleep", "GET /v1/wait?timeout_ms=100 HTTP/1.1\r\n" + auth + "Content-Length: 100\r\n\r\n{", 408},
		{"renew ignores its body", "POST /v1/sessions/default/renew HTTP/1.1\r\n" + auth + "Content-Length: 100\r\n\r\n{", 408},
		{"GET with a body", "GET /v1/jobs/" + id + " HTTP/1.1\r\n" + auth + "Content-Length: 100\r\n\r\n{", 408},
		{"wait with a body", "GET /v1/jobs/" + id + "/wait HTTP/1.1\r\n" + auth + "Content-Length: 100\r\n\r\n{", 408},
		{"DELETE with a body", "DELETE /v1/sessions/default HTTP/1.1\r\n" + auth + "Content-Length: 100\r\n\r\n{", 408},
		{"unknown path", "POST /v2/x HTTP/1.1\r\n" + auth + "Content-Length: 100\r\n\r\n{", 408},
		{"no token", "POST /v1/jobs HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", 401},
		{"text/plain", "POST /v1/jobs HTTP/1.1\r\nAuthorization: Bearer t\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n{", 415},
		{"cross-origin", "POST /v1/jobs HTTP/1.1\r\n" + auth + "Origin: http://evil.example\r\nContent-Length: 100\r\n\r\n{", 403},
		{"probe", "GET /healthz HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", 408},
	}
	addr := strings.TrimPrefix(h.url, "http://")
	var wg sync.WaitGroup
	for _, tt := range tests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			head := strings.Replace(tt.head, "\r\n", "\r\nHost: "+addr+"\r\n", 1)
			if _, err := io.WriteString(c, head); err != nil {
				t.Error(err)
				return
			}
			// The body stalls here. Well within this, the server must answer and hang up.
			_ = c.SetReadDeadline(time.Now().Add(timeout + 5*time.Second))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Errorf("%s: no reply: %v", tt.name, err)
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Errorf("%s: status %d, want %d: %s", tt.name, resp.StatusCode, tt.status, body)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("%s: connection still open after the reply (%v)", tt.name, err)
			}
		}()
	}
	wg.Wait()
	if got := len(h.disp.Works()); got != 1 {
		t.Errorf("%d jobs dispatched, want 1", got)
	}
}

// TestBodyTimeoutLifted: once the body is in, its deadline no longer applies: a request that
// lasts longer than the body timeout (a blocking start, a wait) is answered in full.
func TestBodyTimeoutLifted(t *testing.T) {
	const timeout = 200 * time.Millisecond
	h := newHarness(t, httpapi.Config{BodyTimeout: timeout})
	h.disp.SetRun(func(w *coordinator.Work) {
		h.begin(w.JobID)
		go func() {
			time.Sleep(3 * timeout) // the job outlasts the body timeout
			h.output(w.JobID, 0, "done\n")
			h.exit(w.JobID, 0, 5)
		}()
	})
	r := h.start(map[string]any{"command": "sleep 1", "block_until_ms": 5000})
	if r.Job.Status != "succeeded" || r.Output != "done\n" {
		t.Errorf("blocking start past the body timeout: %+v", r)
	}
	// A wait carrying a (JSON) body, which it ignores, still waits past the timeout.
	h.startOnly()
	id := h.start(map[string]any{"command": "sleep 100"}).Job.ID
	start := time.Now()
	w := h.do("GET", "/v1/jobs/"+id+"/wait?timeout_ms=600", strings.NewReader("{}"), "Content-Type", "application/json")
	if w.status != 200 || !strings.Contains(string(w.body), `"done":false`) || time.Since(start) < 600*time.Millisecond {
		t.Errorf("wait with a body: %d %s after %s", w.status, w.body, time.Since(start))
	}
}
