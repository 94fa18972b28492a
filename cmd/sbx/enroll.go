package main

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/sbx-dev/sbx/cmd/sbx/natsauth"
	"github.com/sbx-dev/sbx/proto"
)

// enrollPath is the route a runner with no creds of its own gets them from, with the enroll key.
const enrollPath = "/v1/enroll"

// enrollRequest and enrollReply are the bodies of POST /v1/enroll.
type enrollRequest struct {
	RunnerID string `json:"runner_id"`
	// Pool, when set, limits the creds to that pool's work.
	Pool string `json:"pool,omitempty"`
}

type enrollReply struct {
	RunnerID string `json:"runner_id"`
	// Creds is a NATS credentials file for the runner.
	Creds string `json:"creds"`
}

// enroller mints runner creds for callers that hold the enroll key. The enroll key is as strong as
// the creds of every runner: whoever holds it acts as any runner id (never as the coordinator).
type enroller struct {
	key  string
	auth *natsauth.Authority
	log  *slog.Logger
}

func (e *enroller) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+e.key)) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sbx-enroll"`)
		enrollError(w, http.StatusUnauthorized, "unauthorized", "Enrolling needs the header Authorization: Bearer KEY with the coordinator's enroll key.")
		return
	}
	var req enrollRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		enrollError(w, http.StatusBadRequest, "invalid", "The body must be {\"runner_id\": ID}: "+err.Error())
		return
	}
	if !proto.ValidToken(req.RunnerID) {
		enrollError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("runner_id %q must be 1-64 characters of letters, digits, '_' and '-'.", req.RunnerID))
		return
	}
	if req.Pool != "" && !proto.ValidToken(req.Pool) {
		enrollError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("pool %q must be 1-64 characters of letters, digits, '_' and '-'.", req.Pool))
		return
	}
	creds, err := e.auth.RunnerCreds(req.RunnerID, req.Pool)
	if err != nil {
		e.log.Error("enroll", "runner", req.RunnerID, "err", err)
		enrollError(w, http.StatusInternalServerError, "internal", "The creds could not be made.")
		return
	}
	e.log.Info("runner enrolled", "runner", req.RunnerID, "from", r.RemoteAddr)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(enrollReply{RunnerID: req.RunnerID, Creds: string(creds)})
}

func enrollError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// enroll asks the coordinator at base for the creds of runner id of pool with the enroll key.
func enroll(ctx context.Context, base, key, id, pool string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	body, _ := json.Marshal(enrollRequest{RunnerID: id, Pool: pool})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+enrollPath, bytes.NewReader(body))
	if err != nil {
		return nil, usageError("--enroll: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("enroll: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("enroll: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		if json.Unmarshal(data, &e) == nil && e.Error.Message != "" {
			return nil, fmt.Errorf("enroll: %s", e.Error.Message)
		}
		return nil, fmt.Errorf("enroll: %s", resp.Status)
	}
	var reply enrollReply
	if err := json.Unmarshal(data, &reply); err != nil || reply.Creds == "" {
		return nil, fmt.Errorf("enroll: the reply holds no creds")
	}
	return []byte(reply.Creds), nil
}
