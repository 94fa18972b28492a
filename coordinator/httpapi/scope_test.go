package httpapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sbx-dev/sbx/coordinator/httpapi"
)

// TestScopedTokens: a scoped token reaches the sessions of its prefix and nothing of the others, on
// every route: jobs (list, get, wait, output, kill, stdin), notifications (long-poll, stream, ack),
// sessions (open, get, renew, end), the Sbx-Session header. The coordinator's token stays
// all-powerful. Any token holder once read, killed and ended any session's jobs.
func TestScopedTokens(t *testing.T) {
	h := newHarness(t, httpapi.Config{Token: "main-token"})
	h.startOnly()
	main := []string{"Authorization", "Bearer main-token"}
	scoped, err := httpapi.ScopedToken("main-token", "agent1-")
	if err != nil {
		t.Fatal(err)
	}
	as := []string{"Authorization", "Bearer " + scoped}
	other := h.start(map[string]any{"command": "sleep 100", "session": "other"}, main...).Job.ID
	mine := h.start(map[string]any{"command": "sleep 100", "session": "agent1-x"}, main...).Job.ID

	// Refused: another session's jobs answer as unknown ones, other sessions are forbidden.
	for _, tt := range []struct {
		method, path string
		body         any
		header       []string
		status       int
	}{
		{"GET", "/v1/jobs/" + other, nil, nil, 404},
		{"GET", "/v1/jobs/" + other + "/wait?timeout_ms=0", nil, nil, 404},
		{"GET", "/v1/jobs/" + other + "/output", nil, nil, 404},
		{"POST", "/v1/jobs/" + other + "/kill", nil, nil, 404},
		{"POST", "/v1/jobs/" + other + "/stdin", map[string]any{"data": "y\n"}, nil, 404},
		{"GET", "/v1/jobs?session=other", nil, nil, 403},
		{"POST", "/v1/jobs", map[string]any{"command": "true", "cwd": h.cwd, "session": "other"}, nil, 403},
		{"POST", "/v1/jobs", map[string]any{"command": "true", "cwd": h.cwd}, []string{"Sbx-Session", "other"}, 403},
		{"GET", "/v1/notifications?session=other", nil, nil, 403},
		{"GET", "/v1/notifications", nil, []string{"Sbx-Session", "other"}, 403},
		{"GET", "/v1/notifications/stream?session=other", nil, nil, 403},
		{"POST", "/v1/notifications/ack", map[string]any{"session": "other", "seq": 0}, nil, 403},
		{"POST", "/v1/sessions", map[string]any{"id": "other"}, nil, 403},
		{"GET", "/v1/sessions/other", nil, nil, 403},
		{"POST", "/v1/sessions/other/renew", nil, nil, 403},
		{"DELETE", "/v1/sessions/other", nil, nil, 403},
		{"GET", "/v1/elsewhere", nil, nil, 403}, // paths not known to be scoped fail closed
	} {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			header := append(append([]string{}, as...), tt.header...)
			var r *reply
			if tt.body != nil {
				r = h.post(tt.path, tt.body, header...)
			} else {
				r = h.do(tt.method, tt.path, nil, header...)
			}
			if r.status != tt.status {
				t.Errorf("status %d, want %d: %s", r.status, tt.status, r.body)
			}
		})
	}

	// Allowed: its own sessions, and a start without a session lands in the prefix's own.
	var list struct{ Jobs []job }
	h.get("/v1/jobs", as...).decode(t, &list)
	if len(list.Jobs) != 1 || list.Jobs[0].ID != mine {
		t.Errorf("the scoped listing shows %+v, want only %s", list.Jobs, mine)
	}
	if r := h.get("/v1/jobs/"+mine, as...); r.status != http.StatusOK {
		t.Errorf("own job: status %d", r.status)
	}
	if s := h.start(map[string]any{"command": "true"}, as...); s.Job.Session != "agent1-" {
		t.Errorf("a scoped start without a session went to %q, want the prefix's session", s.Job.Session)
	}
	if r := h.get("/v1/notifications", as...); r.status != http.StatusOK {
		t.Errorf("own notifications: status %d: %s", r.status, r.body)
	}
	if r := h.do("DELETE", "/v1/sessions/agent1-x", nil, as...); r.status != http.StatusOK {
		t.Errorf("end own session: status %d: %s", r.status, r.body)
	}

	// The coordinator's token sees everything; a scoped token that was not derived from it is no
	// token at all.
	if r := h.get("/v1/jobs/"+other, main...); r.status != http.StatusOK {
		t.Errorf("the main token: status %d", r.status)
	}
	forged, _ := httpapi.ScopedToken("another-token", "agent1-")
	relabeled := strings.Replace(scoped, "agent1-", "other", 1)
	for _, bad := range []string{forged, relabeled, "sbxs.", "sbxs.agent1-."} {
		if r := h.get("/v1/jobs", "Authorization", "Bearer "+bad); r.status != http.StatusUnauthorized {
			t.Errorf("token %q: status %d, want 401", bad, r.status)
		}
	}
}
