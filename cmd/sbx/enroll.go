package main

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/sbx-dev/sbx/coordinator/natsauth"
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
	// ttl is how long the creds it mints are valid: an enrolled runner renews them through the
	// route before they lapse, and a runner that stops enrolling (its key changed, or it is gone)
	// loses NATS by then.
	ttl time.Duration
	// failures counts refused enrollments by source address: past enrollMaxFailures within
	// enrollWindow an address is refused outright (429) until the window ends, so that the key
	// cannot be guessed at thousands a second.
	mu       sync.Mutex
	failures map[string]*enrollFailures
	now      func() time.Time
}

// enrollFailures are the refused enrollments of one address since start.
type enrollFailures struct {
	n     int
	start time.Time
}

// Enrollment's bounds: failures an address may have in a window, the window, the body's size and
// the table of addresses.
const (
	enrollMaxFailures = 10
	enrollWindow      = time.Minute
	enrollMaxBody     = 4 << 10
	enrollMaxSources  = 10_000
)

// defaultEnrollTTL is how long enrolled creds are valid unless --enroll-creds-ttl says.
const defaultEnrollTTL = 24 * time.Hour

func newEnroller(key string, auth *natsauth.Authority, ttl time.Duration, log *slog.Logger) *enroller {
	return &enroller{key: key, auth: auth, ttl: ttl, log: log, failures: map[string]*enrollFailures{}, now: time.Now}
}

// source is the address a request came from, without its port.
func source(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// limited reports whether src has used up its failures of the current window.
func (e *enroller) limited(src string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := e.failures[src]
	return f != nil && e.now().Sub(f.start) < enrollWindow && f.n >= enrollMaxFailures
}

// fail counts a refused enrollment of src and logs it.
func (e *enroller) fail(src, why string) {
	e.mu.Lock()
	now := e.now()
	if len(e.failures) >= enrollMaxSources {
		for a, f := range e.failures {
			if now.Sub(f.start) >= enrollWindow {
				delete(e.failures, a)
			}
		}
	}
	f := e.failures[src]
	if f == nil || now.Sub(f.start) >= enrollWindow {
		f = &enrollFailures{start: now}
		if len(e.failures) < enrollMaxSources {
			e.failures[src] = f
		}
	}
	f.n++
	n := f.n
	e.mu.Unlock()
	e.log.Warn("enroll refused", "from", src, "why", why, "failures", n)
}

func (e *enroller) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	src := source(r)
	if e.limited(src) {
		w.Header().Set("Retry-After", fmt.Sprint(int(enrollWindow.Seconds())))
		enrollError(w, http.StatusTooManyRequests, "rate_limited", fmt.Sprintf("Too many refused enrollments from %s: try again in a minute.", src))
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+e.key)) != 1 {
		e.fail(src, "wrong enroll key")
		w.Header().Set("WWW-Authenticate", `Bearer realm="sbx-enroll"`)
		enrollError(w, http.StatusUnauthorized, "unauthorized", "Enrolling needs the header Authorization: Bearer KEY with the coordinator's enroll key.")
		return
	}
	var req enrollRequest
	if err := decodeStrict(http.MaxBytesReader(w, r.Body, enrollMaxBody), &req); err != nil {
		e.fail(src, err.Error())
		enrollError(w, http.StatusBadRequest, "invalid", "The body must be {\"runner_id\": ID, \"pool\": P} with pool optional: "+err.Error())
		return
	}
	if !proto.ValidToken(req.RunnerID) {
		e.fail(src, "bad runner_id")
		enrollError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("runner_id %q must be 1-64 characters of letters, digits, '_' and '-'.", req.RunnerID))
		return
	}
	if req.Pool != "" && !proto.ValidToken(req.Pool) {
		e.fail(src, "bad pool")
		enrollError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("pool %q must be 1-64 characters of letters, digits, '_' and '-'.", req.Pool))
		return
	}
	creds, err := e.auth.RunnerCreds(req.RunnerID, req.Pool, e.ttl)
	if err != nil {
		e.log.Error("enroll", "runner", req.RunnerID, "err", err)
		enrollError(w, http.StatusInternalServerError, "internal", "The creds could not be made.")
		return
	}
	e.log.Info("runner enrolled", "runner", req.RunnerID, "pool", req.Pool, "from", src)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(enrollReply{RunnerID: req.RunnerID, Creds: string(creds)})
}

// decodeStrict decodes one JSON object into v: no unknown fields, no key twice, nothing after it.
// encoding/json takes the last of duplicate keys, so {"runner_id":"r1","runner_id":"coordinator"}
// would be read as coordinator by this decoder and as r1 by a check that reads the first. (The
// API's decoder, in coordinator/httpapi, is the adapter's own and does not look for duplicates.)
func decodeStrict(body io.Reader, v any) error {
	data, err := io.ReadAll(body)
	if err != nil {
		return fmt.Errorf("body: %w", err)
	}
	if err := uniqueKeys(data); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("body: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("body: trailing data after the JSON object")
	}
	return nil
}

// uniqueKeys checks that no object of the JSON text data has a key twice.
func uniqueKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var objects []map[string]bool // the keys seen in each open object; nil for an array
	expectKey := func() bool { return len(objects) > 0 && objects[len(objects)-1] != nil }
	afterKey := false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("body: %w", err)
		}
		switch tok {
		case json.Delim('{'):
			objects = append(objects, map[string]bool{})
			afterKey = false
			continue
		case json.Delim('['):
			objects = append(objects, nil)
			afterKey = false
			continue
		case json.Delim('}'), json.Delim(']'):
			objects = objects[:len(objects)-1]
			afterKey = false
			continue
		}
		if expectKey() && !afterKey {
			key, _ := tok.(string)
			if objects[len(objects)-1][key] {
				return fmt.Errorf("body: key %q appears twice", key)
			}
			objects[len(objects)-1][key] = true
			afterKey = true
			continue
		}
		afterKey = false
	}
}

func enrollError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// enroll asks the coordinator at base for the creds of runner id of pool with the enroll key.
func enroll(ctx context.Context, bases, key, id, pool string) ([]byte, error) {
	// A fleet's coordinators, comma-separated: any of them answers (one forwards to the leader),
	// so the next is tried when one cannot.
	var errs []error
	for base := range strings.SplitSeq(bases, ",") {
		creds, err := enrollAt(ctx, strings.TrimSpace(base), key, id, pool)
		if err == nil {
			return creds, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

func enrollAt(ctx context.Context, base, key, id, pool string) ([]byte, error) {
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

// enrolledCreds are an enrolled runner's creds, held in memory only (nothing on disk for a job to
// find) and renewed through the enroll route before they lapse.
type enrolledCreds struct {
	base, key, id, pool string

	mu      sync.Mutex
	creds   []byte
	issued  time.Time
	expires time.Time // zero: never
}

// enrollRunner enrolls runner id of pool at base with the enroll key.
func enrollRunner(ctx context.Context, base, key, id, pool string) (*enrolledCreds, error) {
	c := &enrolledCreds{base: base, key: key, id: id, pool: pool}
	if err := c.enroll(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *enrolledCreds) enroll(ctx context.Context) error {
	creds, err := enroll(ctx, c.base, c.key, c.id, c.pool)
	if err != nil {
		return err
	}
	issued, expires, err := natsauth.Lifetime(creds)
	if err != nil {
		return fmt.Errorf("enroll: %w", err)
	}
	c.mu.Lock()
	c.creds, c.issued, c.expires = creds, issued, expires
	c.mu.Unlock()
	return nil
}

// option connects as the user of the creds held now: a reconnect after a renewal uses the new ones.
func (c *enrolledCreds) option() nats.Option {
	split := func() (string, []byte, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return natsauth.Split(c.creds)
	}
	return nats.UserJWT(func() (string, error) {
		token, _, err := split()
		return token, err
	}, func(nonce []byte) ([]byte, error) {
		_, seed, err := split()
		if err != nil {
			return nil, err
		}
		kp, err := nkeys.FromSeed(seed)
		if err != nil {
			return nil, err
		}
		defer kp.Wipe()
		return kp.Sign(nonce)
	})
}

// renewAt is when creds of a lifetime are renewed: two thirds of the way, so that a coordinator
// that is down for a while does not cost the runner its NATS.
func renewAt(issued, expires time.Time) time.Time {
	return issued.Add(expires.Sub(issued) * 2 / 3)
}

// renew renews the creds before they lapse until ctx ends, and then reconnects nc on the new ones.
// A failed renewal is tried again every tenth of the time left, at least every 5 s.
func (c *enrolledCreds) renew(ctx context.Context, nc *nats.Conn, log *slog.Logger) {
	for {
		c.mu.Lock()
		issued, expires := c.issued, c.expires
		c.mu.Unlock()
		if expires.IsZero() {
			return
		}
		wait := time.Until(renewAt(issued, expires))
		for {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return
			}
			err := c.enroll(ctx)
			if err == nil {
				break
			}
			wait = max(time.Until(expires)/10, 5*time.Second)
			log.Warn("renew enrolled creds", "err", err, "expires", expires, "retry_in", wait)
		}
		log.Info("renewed enrolled creds")
		if err := nc.ForceReconnect(); err != nil {
			log.Warn("reconnect on renewed creds", "err", err)
		}
	}
}
