package httpapi_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/sbx-dev/sbx/coordinator/httpapi"
)

// TestBrowserGuard: with no token (the default) a web page must not reach the API: not by a
// cross-origin request, not by a body a browser sends without a preflight, not through DNS
// rebinding. Clients that are not browsers send none of these headers and pass.
func TestBrowserGuard(t *testing.T) {
	h := newHarness(t, httpapi.Config{AllowedHosts: []string{"sbx.example.com"}})
	h.finishWith("", 0)
	u, err := url.Parse(h.url)
	if err != nil {
		t.Fatal(err)
	}
	port := u.Port()
	job := `{"command":"touch /tmp/pwned","cwd":"/"}`
	tests := []struct {
		name   string
		header []string
		status int
		want   string // in the error's message
	}{
		{"text/plain from a page", []string{"Content-Type", "text/plain", "Origin", "http://evil.example"}, 403, "Origin: http://evil.example"},
		{"text/plain without Origin", []string{"Content-Type", "text/plain"}, 415, "Content-Type: application/json"},
		{"form", []string{"Content-Type", "application/x-www-form-urlencoded"}, 415, "Content-Type: application/json"},
		{"no Content-Type", []string{"Content-Type", ""}, 415, "Content-Type: application/json"},
		{"JSON from another origin", []string{"Origin", "http://evil.example"}, 403, "Origin"},
		{"JSON from another port", []string{"Origin", "http://127.0.0.1:1"}, 403, "Origin"},
		{"JSON from an https origin", []string{"Origin", "https://" + u.Host}, 403, "Origin"},
		{"Origin null", []string{"Origin", "null"}, 403, "Origin"},
		{"Sec-Fetch-Site cross-site", []string{"Sec-Fetch-Site", "cross-site"}, 403, "cross-site"},
		{"Sec-Fetch-Site same-site", []string{"Sec-Fetch-Site", "same-site"}, 403, "same-site"},
		{"DNS rebinding", []string{"Host", "evil.example:" + port}, 403, "evil.example"},
		{"rebinding without port", []string{"Host", "evil.example"}, 403, "--allow-host"},
		{"private address", []string{"Host", "10.1.2.3:" + port}, 403, "10.1.2.3"},
		{"curl, the CLI", nil, 201, ""},
		{"charset", []string{"Content-Type", "application/json; charset=utf-8"}, 201, ""},
		{"same origin", []string{"Origin", h.url}, 201, ""},
		{"Sec-Fetch-Site same-origin", []string{"Sec-Fetch-Site", "same-origin", "Origin", h.url}, 201, ""},
		{"Sec-Fetch-Site none", []string{"Sec-Fetch-Site", "none"}, 201, ""},
		{"localhost", []string{"Host", "localhost:" + port}, 201, ""},
		{"IPv6 loopback", []string{"Host", "[::1]:" + port}, 201, ""},
		{"allowed host", []string{"Host", "SBX.example.com:" + port}, 201, ""},
	}
	created := 0
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := h.post("/v1/jobs", job, tt.header...)
			if tt.status == 201 {
				created++
				if r.status != 201 {
					t.Errorf("status %d: %s", r.status, r.body)
				}
				return
			}
			code := map[int]string{403: "forbidden", 415: "unsupported_media_type"}[tt.status]
			r.wantError(t, tt.status, code, tt.want)
		})
	}
	if got := len(h.disp.Works()); got != created {
		t.Errorf("%d jobs dispatched, want %d: a refused request ran", got, created)
	}
}

// TestBrowserGuardEverywhere: the checks hold on every route, reads and probes included; the
// probes need no token, but their Host is checked too.
func TestBrowserGuardEverywhere(t *testing.T) {
	h := newHarness(t, httpapi.Config{Token: "s3cret"})
	auth := "Bearer s3cret"
	tests := []struct {
		method, path string
		header       []string
		status       int
	}{
		{"GET", "/v1/jobs", []string{"Authorization", auth, "Origin", "http://evil.example"}, 403},
		{"GET", "/v1/jobs/0000000000000/output?follow=true", []string{"Authorization", auth, "Sec-Fetch-Site", "cross-site"}, 403},
		{"DELETE", "/v1/sessions/default", []string{"Authorization", auth, "Origin", "http://evil.example"}, 403},
		{"POST", "/v1/jobs/0000000000000/kill", []string{"Authorization", auth, "Host", "evil.example"}, 403},
		{"GET", "/v2/unknown", []string{"Authorization", auth, "Origin", "http://evil.example"}, 403},
		{"GET", "/healthz", []string{"Host", "evil.example"}, 403},
		{"GET", "/metrics", []string{"Host", "evil.example"}, 403},
		{"GET", "/readyz", []string{"Host", "evil.example"}, 403},
		{"GET", "/metrics", []string{"Host", "localhost"}, 200},
		{"GET", "/healthz", nil, 200},
		{"GET", "/v1/jobs", []string{"Authorization", auth}, 200},
		{"GET", "/v1/jobs", []string{"Origin", "http://evil.example"}, 403}, // before the token: no oracle
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path+" "+strings.Join(tt.header, " "), func(t *testing.T) {
			r := h.do(tt.method, tt.path, nil, tt.header...)
			if tt.status == 403 {
				r.wantError(t, 403, "forbidden", "")
			} else if r.status != tt.status {
				t.Errorf("status %d, want %d: %s", r.status, tt.status, r.body)
			}
		})
	}
}

// TestAnyHost: AnyHost turns the Host check off (for deployments behind a token); Origin still holds.
func TestAnyHost(t *testing.T) {
	h := newHarness(t, httpapi.Config{Token: "t", AllowedHosts: []string{httpapi.AnyHost}})
	if r := h.get("/v1/jobs", "Authorization", "Bearer t", "Host", "sbx.internal:7070"); r.status != 200 {
		t.Errorf("any host: %d %s", r.status, r.body)
	}
	h.get("/v1/jobs", "Authorization", "Bearer t", "Origin", "http://evil.example").wantError(t, 403, "forbidden", "Origin")
}

// TestMountedHandlers: Config.Handlers are served behind the same checks as /v1.
func TestMountedHandlers(t *testing.T) {
	extra := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := newHarness(t, httpapi.Config{Token: "t", Handlers: map[string]http.Handler{"/extra": extra}})
	if r := h.post("/extra", "{}", "Authorization", "Bearer t"); r.status != http.StatusTeapot {
		t.Errorf("mounted handler: %d %s", r.status, r.body)
	}
	h.post("/extra", "{}").wantError(t, 401, "unauthorized", "Bearer")
	h.post("/extra", "{}", "Authorization", "Bearer t", "Origin", "http://evil.example").wantError(t, 403, "forbidden", "Origin")
	h.post("/extra", "{}", "Authorization", "Bearer t", "Content-Type", "text/plain").wantError(t, 415, "unsupported_media_type", "Content-Type")
	// The strict JSON checks hold too: an MCP message would otherwise run a rewritten command.
	h.post("/extra", `{"params":{"arguments":{"command":"echo \udc00"}}}`, "Authorization", "Bearer t").wantError(t, 400, "invalid", "params.arguments.command is not valid UTF-8")
	h.post("/extra", `{"id":1,"id":2}`, "Authorization", "Bearer t").wantError(t, 400, "invalid", "id is given twice")
}
