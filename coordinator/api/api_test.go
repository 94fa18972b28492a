package api_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/api"
)

// TestPaths: every id is one escaped segment of its route, dots included, so that no id moves a
// path to another route; the queries carry only what was given.
func TestPaths(t *testing.T) {
	after := uint64(7)
	for _, c := range []struct{ got, want string }{
		{api.JobPath("j1"), "/v1/jobs/j1"},
		{api.JobPath(".."), "/v1/jobs/%2E%2E"},
		{api.JobPath("a/b?c"), "/v1/jobs/a%2Fb%3Fc"},
		{api.JobKillPath("../x"), "/v1/jobs/%2E%2E%2Fx/kill"},
		{api.JobStdinPath("j1"), "/v1/jobs/j1/stdin"},
		{api.JobResizePath("j1"), "/v1/jobs/j1/resize"},
		{api.JobWaitPath("j1", -1, "", ""), "/v1/jobs/j1/wait"},
		{api.JobWaitPath("j1", 1500*time.Millisecond, "^ok$", "any"), "/v1/jobs/j1/wait?pattern=%5Eok%24&port=any&timeout_ms=1500"},
		{api.JobOutputPath("j1", 5, -1), "/v1/jobs/j1/output?offset=5"},
		{api.JobOutputPath("j1", 0, 10), "/v1/jobs/j1/output?limit=10&offset=0"},
		{api.JobFollowPath("j1", 3), "/v1/jobs/j1/output?follow=true&offset=3"},
		{api.SleepPath(2 * time.Second), "/v1/wait?timeout_ms=2000"},
		{api.SessionPath("s.1"), "/v1/sessions/s%2E1"},
		{api.SessionRenewPath("s1"), "/v1/sessions/s1/renew"},
		{api.JobsQuery{}.Path(), "/v1/jobs"},
		{api.JobsQuery{Session: "s", Status: api.StatusRunning, Limit: 5}.Path(), "/v1/jobs?limit=5&session=s&status=running"},
		{api.NotificationsQuery{}.Path(), "/v1/notifications"},
		{api.NotificationsQuery{Session: "s", After: &after, Wait: time.Second, Limit: 2, Format: api.FormatTask}.Path(),
			"/v1/notifications?after=7&format=task_notification&limit=2&session=s&wait_ms=1000"},
	} {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
}

// TestStartRequestJSON: the body sends BlockUntil as block_until_ms and leaves out what is unset,
// the idempotency key (a header) included.
func TestStartRequestJSON(t *testing.T) {
	data, err := json.Marshal(api.StartRequest{Command: "ls", Cwd: "/", IdempotencyKey: "k", BlockUntil: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(data), `{"command":"ls","cwd":"/","block_until_ms":2000}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
