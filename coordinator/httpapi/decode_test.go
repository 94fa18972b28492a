package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sbx-dev/sbx/coordinator"
)

// FuzzCheckJSON: checkJSON never panics, and a body it accepts decodes without any string
// rewritten: every U+FFFD in the decoded value was in the body, as the character or its escape.
func FuzzCheckJSON(f *testing.F) {
	for _, seed := range []string{
		`{"command":"ls","cwd":"/"}`, `{"a":1,"a":2}`, `{"a":{"b":[1,{"c":"\ud800"}]}}`,
		`{"a":"\ud83d\ude00"}`, `{"a":"\\ud800"}`, "{\"a\":\"\xff\"}", `{"a":"\udc00\ud800x"}`,
		`[{"a":1},{"a":1}]`, `{"a":"\ud800\u0041"}`, `{"a":"\ufffd"}`, `{"\ud800":1}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if checkJSON(body) != nil || !json.Valid(body) {
			return
		}
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			return
		}
		inBody := bytes.Count(body, []byte("\uFFFD")) + strings.Count(strings.ToLower(string(body)), `\ufffd`)
		if got := countReplacement(v); got > inBody {
			t.Fatalf("accepted %q, which decodes with %d U+FFFD of which the body has %d", body, got, inBody)
		}
	})
}

func countReplacement(v any) int {
	switch v := v.(type) {
	case string:
		return strings.Count(v, "\uFFFD")
	case []any:
		n := 0
		for _, e := range v {
			n += countReplacement(e)
		}
		return n
	case map[string]any:
		n := 0
		for k, e := range v {
			n += strings.Count(k, "\uFFFD") + countReplacement(e)
		}
		return n
	}
	return 0
}

// TestDecodeEmbeddedPath: a field of the body that startBody holds in an embedded struct is named
// as the body has it, without the struct's Go name that encoding/json puts first.
func TestDecodeEmbeddedPath(t *testing.T) {
	for body, want := range map[string]string{
		`{"limits":{"pids":"many"}}`:  "limits.pids must be a number.",
		`{"command":["ls"]}`:          "command must be a string.",
		`{"block_until_ms":"soon"}`:   "block_until_ms must be a number.",
		`{"tty_size":{"rows":true}}`:  "tty_size.rows must be a number.",
		`{"notify_on_output":"FAIL"}`: "notify_on_output must be an object.",
	} {
		var b startBody
		err := decodeBody(httptest.NewRequest("POST", "/v1/jobs", strings.NewReader(body)), &b, false)
		if got := coordinator.ErrorMessage(err); got != want {
			t.Errorf("%s: %q, want %q", body, got, want)
		}
	}
}
