package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	e := newEnroller("the-enroll-key-of-this-test", auth, time.Hour, slog.New(slog.NewTextHandler(&logs, nil)))
	now := time.Now()
	e.now = func() time.Time { return now }
	post := func(key, body string) (int, map[string]any) {
		t.Helper()
		r := httptest.NewRequest(http.MethodPost, enrollPath, strings.NewReader(body))
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

// TestShortSecretsRefused: a token file or enroll key under 16 bytes stops the start with a message
// naming the file. Before, one byte was accepted.
func TestShortSecretsRefused(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	accountKey := filepath.Join(dir, "auth", natsauth.AccountSeedFile)
	if _, err := natsauth.Open(filepath.Join(dir, "auth")); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"token":      {"coordinator", "--nats", "nats://127.0.0.1:1", "--token-file", short},
		"enroll key": {"coordinator", "--nats", "nats://127.0.0.1:1", "--enroll-key", short, "--nats-account-key", accountKey},
	} {
		t.Run(name, func(t *testing.T) {
			// A start that took the secret would wait for NATS: the deadline makes that a failure.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			err := run(ctx, append(args, "--data", t.TempDir()), func(string) string { return "" }, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), short) || !strings.Contains(err.Error(), "at least 16") {
				t.Fatalf("a 1-byte secret: %v, want refused naming the file", err)
			}
		})
	}
}
