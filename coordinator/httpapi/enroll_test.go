package httpapi

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/api"
	"github.com/sbx-dev/sbx/coordinator/natsauth"
)

// TestEnrollStrict: the enroll route reads one JSON object with no key twice and nothing after it,
// and after enrollMaxFailures refusals from one address it refuses that address, right key or not,
// until the window ends; each refusal is logged with its address. Before, a body naming runner_id
// twice got the creds of the last, and wrong keys were tried at thousands a second without a trace.
func TestEnrollStrict(t *testing.T) {
	auth, err := natsauth.Open(filepath.Join(t.TempDir(), "auth"))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	e := NewEnroller("the-enroll-key-of-this-test", auth, time.Hour, slog.New(slog.NewTextHandler(&logs, nil)))
	now := time.Now()
	e.now = func() time.Time { return now }
	post := func(key, body string) (int, map[string]any) {
		t.Helper()
		r := httptest.NewRequest(http.MethodPost, api.RouteEnroll, strings.NewReader(body))
		r.RemoteAddr = "192.0.2.7:40000"
		r.Header.Set("Authorization", "Bearer "+key)
		w := httptest.NewRecorder()
		e.ServeHTTP(w, r)
		var reply map[string]any
		_ = json.Unmarshal(w.Body.Bytes(), &reply)
		return w.Code, reply
	}
	for _, body := range []string{
		`{"runner_id":"r1","runner_id":"coordinator"}`,
		`{"runner_id":"r1"} {"runner_id":"r2"}`,
		`{"runner_id":"r1"}x`,
		`{"runner_id":"r1","extra":1}`,
		`{"runner_id":"r1","pool":"a","pool":"b"}`,
	} {
		if code, reply := post(e.key, body); code != http.StatusBadRequest {
			t.Errorf("body %s: %d %v, want 400", body, code, reply)
		}
	}
	code, reply := post(e.key, `{"runner_id":"r1","pool":"p"}`)
	if code != http.StatusOK {
		t.Fatalf("a good enrollment: %d %v", code, reply)
	}
	if id, err := natsauth.RunnerOf([]byte(reply["creds"].(string))); err != nil || id != "r1" {
		t.Fatalf("creds of %q (%v)", id, err)
	}
	if issued, expires, err := natsauth.Lifetime([]byte(reply["creds"].(string))); err != nil || expires.Sub(issued) != time.Hour {
		t.Fatalf("enrolled creds issued %v expire %v (%v), want an hour later", issued, expires, err)
	}
	for i := 5; i < enrollMaxFailures; i++ {
		if code, _ := post("wrong-key-wrong-key", `{"runner_id":"r1"}`); code != http.StatusUnauthorized {
			t.Fatalf("wrong key %d: %d, want 401", i, code)
		}
	}
	if code, _ := post(e.key, `{"runner_id":"r1"}`); code != http.StatusTooManyRequests {
		t.Fatalf("after %d refusals: %d, want 429", enrollMaxFailures, code)
	}
	if n := strings.Count(logs.String(), "enroll refused"); n != enrollMaxFailures || !strings.Contains(logs.String(), "from=192.0.2.7") {
		t.Fatalf("%d refusals logged, want %d with the address:\n%s", n, enrollMaxFailures, logs.String())
	}
	now = now.Add(enrollWindow)
	if code, _ := post(e.key, `{"runner_id":"r1"}`); code != http.StatusOK {
		t.Fatalf("after the window: %d, want 200", code)
	}
}
