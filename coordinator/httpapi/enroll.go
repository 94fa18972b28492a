package httpapi

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/api"
	"github.com/sbx-dev/sbx/proto"
)

// Minter mints a runner's NATS creds (the NATS authority's account key signs them): for runner id,
// limited to pool's work when pool is set, valid for ttl.
type Minter interface {
	RunnerCreds(id, pool string, ttl time.Duration) ([]byte, error)
}

// Enroller mints runner creds for callers that hold the enroll key. The enroll key is as strong as
// the creds of every runner: whoever holds it acts as any runner id (never as the coordinator).
type Enroller struct {
	key  string
	auth Minter
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

// NewEnroller returns the handler of POST /v1/enroll (Config.Enroll): it mints, with auth, creds
// valid for ttl for the callers that hold key.
func NewEnroller(key string, auth Minter, ttl time.Duration, log *slog.Logger) *Enroller {
	return &Enroller{key: key, auth: auth, ttl: ttl, log: log, failures: map[string]*enrollFailures{}, now: time.Now}
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
func (e *Enroller) limited(src string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := e.failures[src]
	return f != nil && e.now().Sub(f.start) < enrollWindow && f.n >= enrollMaxFailures
}

// fail counts a refused enrollment of src and logs it.
func (e *Enroller) fail(src, why string) {
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

func (e *Enroller) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	src := source(r)
	if e.limited(src) {
		w.Header().Set("Retry-After", fmt.Sprint(int(enrollWindow.Seconds())))
		writeCode(w, codeRateLimited, fmt.Sprintf("Too many refused enrollments from %s: try again in a minute.", src))
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+e.key)) != 1 {
		e.fail(src, "wrong enroll key")
		w.Header().Set("WWW-Authenticate", `Bearer realm="sbx-enroll"`)
		writeCode(w, coordinator.EUNAUTHORIZED, "Enrolling needs the header Authorization: Bearer KEY with the coordinator's enroll key.")
		return
	}
	var req api.EnrollRequest
	if err := decodeStrict(http.MaxBytesReader(w, r.Body, enrollMaxBody), &req); err != nil {
		e.fail(src, err.Error())
		writeCode(w, coordinator.EINVALID, "The body must be {\"runner_id\": ID, \"pool\": P} with pool optional: "+err.Error())
		return
	}
	if !proto.ValidToken(req.RunnerID) {
		e.fail(src, "bad runner_id")
		writeCode(w, coordinator.EINVALID, fmt.Sprintf("runner_id %q must be 1-64 characters of letters, digits, '_' and '-'.", req.RunnerID))
		return
	}
	if req.Pool != "" && !proto.ValidToken(req.Pool) {
		e.fail(src, "bad pool")
		writeCode(w, coordinator.EINVALID, fmt.Sprintf("pool %q must be 1-64 characters of letters, digits, '_' and '-'.", req.Pool))
		return
	}
	creds, err := e.auth.RunnerCreds(req.RunnerID, req.Pool, e.ttl)
	if err != nil {
		e.log.Error("enroll", "runner", req.RunnerID, "err", err)
		writeCode(w, coordinator.EINTERNAL, "The creds could not be made.")
		return
	}
	e.log.Info("runner enrolled", "runner", req.RunnerID, "pool", req.Pool, "from", src)
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, api.EnrollReply{RunnerID: req.RunnerID, Creds: string(creds)})
}

// decodeStrict decodes one JSON object into v: no unknown fields, no key twice, nothing after it.
// encoding/json takes the last of duplicate keys, so {"runner_id":"r1","runner_id":"coordinator"}
// would be read as coordinator by this decoder and as r1 by a check that reads the first. (The
// rest of the API decodes with decode.go, which does not look for duplicates.)
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
