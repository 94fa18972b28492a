package httpapi

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/proto"
)

// Scoped tokens (docs/security.md, "Scoped tokens"). A scoped token grants the sessions whose id
// starts with its prefix, and nothing of the others: it is
//
//	sbxs.PREFIX.MAC   MAC = base64url(HMAC-SHA256(key: the coordinator's token, "sbx scoped token v1\0" PREFIX))
//
// derived from the coordinator's token rather than stored, so that every coordinator of a fleet,
// which shares the token file but no data directory, accepts it. A prefix has no '.', so the
// token splits without ambiguity. Rotating the coordinator's token revokes every scoped token.
const (
	scopedTokenPrefix = "sbxs."
	scopedTokenLabel  = "sbx scoped token v1\x00"
)

// ScopedToken returns the token that grants the sessions whose id starts with prefix, derived from
// the coordinator's token. A prefix is 1-64 characters of letters, digits, '_' and '-' (end it
// with a separator: "agent1-" does not grant "agent10").
func ScopedToken(token, prefix string) (string, error) {
	if token == "" {
		return "", errors.New("scoped token: the coordinator has no token to derive it from")
	}
	if !proto.ValidToken(prefix) {
		return "", errors.New("scoped token: the session prefix must be 1-64 characters of letters, digits, '_' and '-'")
	}
	return scopedTokenPrefix + prefix + "." + scopeMAC(token, prefix), nil
}

func scopeMAC(token, prefix string) string {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte(scopedTokenLabel + prefix))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// credential checks the request's bearer credential: the coordinator's token (ok, scope ""), a
// scoped token derived from it (ok, scope its prefix), or neither.
func (s *Server) credential(r *http.Request) (ok bool, scope string) {
	given, bearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !bearer {
		return false, ""
	}
	if hmac.Equal([]byte(given), []byte(s.cfg.Token)) {
		return true, ""
	}
	rest, found := strings.CutPrefix(given, scopedTokenPrefix)
	prefix, mac, dot := strings.Cut(rest, ".")
	if !found || !dot || !proto.ValidToken(prefix) {
		return false, ""
	}
	return hmac.Equal([]byte(mac), []byte(scopeMAC(s.cfg.Token, prefix))), prefix
}

type scopeKey struct{}

// scopeOf is the session prefix a request's credential is limited to; "" for all sessions.
func scopeOf(ctx context.Context) string {
	p, _ := ctx.Value(scopeKey{}).(string)
	return p
}

// scopedPaths are the paths a scoped token may call (besides the open ones and those with their own
// credential): those about jobs, sessions and notifications, each checked against its scope, and
// what reveals no session's data. Any other path, present or future, is refused to it: it fails
// closed.
func scopedPath(p string) bool {
	for _, allowed := range []string{"/v1/jobs", "/v1/notifications", "/v1/sessions", "/v1/wait", "/v1/runners", "/v1/openapi.json", "/mcp"} {
		if p == allowed || strings.HasPrefix(p, allowed+"/") {
			return true
		}
	}
	return false
}

// inScope returns an error unless session is one the request's credential grants. what names
// where the session came from, as CheckSession's messages do.
func inScope(r *http.Request, what, session string) error {
	prefix := scopeOf(r.Context())
	if prefix == "" || strings.HasPrefix(session, prefix) {
		return nil
	}
	return coordinator.Errorf(codeForbidden, "This token grants the sessions whose id starts with %q; %s %q is not one.", prefix, what, session)
}

// checkPathScope holds the ids in a path to the request's scope, for every route under /v1/jobs/{id}
// and /v1/sessions/{id}, whatever follows: a job of another session is answered as an unknown one
// (404), a session outside the scope is refused (403). An id that is no id is left to the route
// (400).
func (s *Server) checkPathScope(r *http.Request) error {
	prefix := scopeOf(r.Context())
	if prefix == "" {
		return nil
	}
	segs := strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/"), "/")
	if len(segs) < 2 || !proto.ValidToken(segs[1]) {
		return nil
	}
	switch segs[0] {
	case "jobs":
		job, err := s.svc.Job(r.Context(), segs[1])
		if err != nil {
			return nil // the route answers it: 404
		}
		if !strings.HasPrefix(job.Session, prefix) {
			return coordinator.Errorf(coordinator.ENOTFOUND, "Job %q does not exist.", segs[1])
		}
	case "sessions":
		return inScope(r, "session id", segs[1])
	}
	return nil
}
