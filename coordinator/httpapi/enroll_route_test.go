package httpapi_test

import (
	"log/slog"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/api"
	"github.com/sbx-dev/sbx/coordinator/httpapi"
	"github.com/sbx-dev/sbx/coordinator/natsauth"
)

// TestEnrollRoute: Config.Enroll serves POST /v1/enroll behind the API's checks but with the enroll
// key instead of the token, and its replies, errors included, are as the document says.
func TestEnrollRoute(t *testing.T) {
	auth, err := natsauth.Open(filepath.Join(t.TempDir(), "auth"))
	if err != nil {
		t.Fatal(err)
	}
	const key = "the-enroll-key-of-this-test"
	h := newHarness(t, httpapi.Config{Token: "t", Enroll: httpapi.NewEnroller(key, auth, time.Hour, slog.New(slog.DiscardHandler))})
	h.post(api.RouteEnroll, `{"runner_id":"r1"}`, "Authorization", "Bearer t").wantError(t, http.StatusUnauthorized, "unauthorized", "enroll key")
	h.post(api.RouteEnroll, `{"runner_id":"r 1"}`, "Authorization", "Bearer "+key).wantError(t, http.StatusBadRequest, "invalid", "runner_id")
	r := h.post(api.RouteEnroll, `{"runner_id":"r1","pool":"p"}`, "Authorization", "Bearer "+key)
	if r.status != http.StatusOK {
		t.Fatalf("enroll: %d %s", r.status, r.body)
	}
	var reply api.EnrollReply
	if r.decode(t, &reply); reply.RunnerID != "r1" {
		t.Fatalf("enroll: %s", r.body)
	}
	if id, err := natsauth.RunnerOf([]byte(reply.Creds)); err != nil || id != "r1" {
		t.Fatalf("creds of %q (%v)", id, err)
	}
	// Without Config.Enroll there is no such route.
	newHarness(t, httpapi.Config{}).post(api.RouteEnroll, `{"runner_id":"r1"}`).wantError(t, http.StatusNotFound, "not_found", "No endpoint")
}
