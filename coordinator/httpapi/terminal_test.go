package httpapi_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/httpapi"
	"github.com/sbx-dev/sbx/proto"
)

// TestTTYAPI: a start's tty and tty_size reach the work and show in the job object; resize is 202
// with the new size, 400 naming the field, 409 for a job without a terminal or an ended one.
func TestTTYAPI(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.startOnly()
	id := h.start(map[string]any{"command": "npm init", "tty": true, "tty_size": map[string]int{"rows": 40, "cols": 100}}).Job.ID
	if w := h.disp.Works(); len(w) != 1 || !w[0].TTY || *w[0].TTYSize != (coordinator.TTYSize{Rows: 40, Cols: 100}) {
		t.Fatalf("work %+v", w)
	}
	view := func(id string) map[string]json.RawMessage {
		t.Helper()
		var v map[string]json.RawMessage
		h.get("/v1/jobs/"+id).decode(t, &v)
		return v
	}
	if v := view(id); string(v["tty"]) != "true" || string(v["tty_size"]) != `{"rows":40,"cols":100}` || string(v["ports"]) != "[]" {
		t.Fatalf("job %s %s %s", v["tty"], v["tty_size"], v["ports"])
	}
	r := h.post("/v1/jobs/"+id+"/resize", map[string]int{"rows": 50, "cols": 132})
	if r.status != http.StatusAccepted || !strings.Contains(string(r.body), `"tty_size":{"rows":50,"cols":132}`) {
		t.Fatalf("resize: %d %s", r.status, r.body)
	}
	if c := h.disp.Controls(); len(c) != 1 || c[0].Op != proto.OpResize || *c[0].Size != (coordinator.TTYSize{Rows: 50, Cols: 132}) {
		t.Fatalf("controls %+v", c)
	}
	for _, tt := range []struct {
		body  any
		field string
	}{
		{map[string]int{"rows": 0, "cols": 80}, "rows"},
		{map[string]int{"rows": 24, "cols": 5000}, "cols"},
		{map[string]int{"cols": 80}, "rows"},
		{map[string]int{"rows": 24}, "cols"},
		{map[string]any{"rows": 24, "cols": 80, "depth": 1}, "depth"},
	} {
		h.post("/v1/jobs/"+id+"/resize", tt.body).wantError(t, 400, "invalid", tt.field)
	}
	for _, tt := range []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{"command": "x", "tty_size": map[string]int{"rows": 24, "cols": 80}}, "tty_size"},
		{map[string]any{"command": "x", "tty": true, "tty_size": map[string]int{"rows": 24, "cols": 0}}, "tty_size.cols"},
	} {
		tt.body["cwd"] = h.cwd
		h.post("/v1/jobs", tt.body).wantError(t, 400, "invalid", tt.field)
	}
	plain := h.start(map[string]any{"command": "make"}).Job.ID
	if v := view(plain); string(v["tty"]) != "false" || string(v["tty_size"]) != "null" {
		t.Fatalf("plain job %s %s", v["tty"], v["tty_size"])
	}
	h.post("/v1/jobs/"+plain+"/resize", map[string]int{"rows": 24, "cols": 80}).wantError(t, 409, "conflict", "no terminal")
	h.exit(id, 0, 0)
	h.post("/v1/jobs/"+id+"/resize", map[string]int{"rows": 24, "cols": 80}).wantError(t, 409, "conflict", "ended")
}

// TestWaitPort: wait?port=N and port=any return once the job lists the port, and say which; a bad
// port is a 400 naming it.
func TestWaitPort(t *testing.T) {
	h := newHarness(t, httpapi.Config{})
	h.startOnly()
	id := h.start(map[string]any{"command": "vite"}).Job.ID
	h.event(&coordinator.Event{Kind: proto.EventActivity, JobID: id, Seq: 1, Ports: []coordinator.Port{{Address: "127.0.0.1", Port: 5173}}})
	type waitReply struct {
		Done bool `json:"done"`
		Port *struct {
			Address string `json:"address"`
			Port    int    `json:"port"`
		} `json:"port"`
		Job map[string]json.RawMessage `json:"job"`
	}
	for _, q := range []string{"?port=5173", "?port=any"} {
		var w waitReply
		h.get("/v1/jobs/"+id+"/wait"+q).decode(t, &w)
		if w.Done || w.Port == nil || w.Port.Address != "127.0.0.1" || w.Port.Port != 5173 || string(w.Job["ports"]) != `[{"address":"127.0.0.1","port":5173}]` {
			t.Fatalf("wait%s: %+v", q, w)
		}
	}
	var w waitReply
	h.get("/v1/jobs/"+id+"/wait?port=8080&timeout_ms=20").decode(t, &w)
	if w.Done || w.Port != nil {
		t.Fatalf("wait for another port: %+v", w)
	}
	for _, q := range []string{"?port=0", "?port=65536", "?port=http", "?port=-1"} {
		h.get("/v1/jobs/"+id+"/wait"+q).wantError(t, 400, "invalid", "port")
	}
}
