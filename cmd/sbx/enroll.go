package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/sbx-dev/sbx/coordinator/api"
	"github.com/sbx-dev/sbx/coordinator/natsauth"
)

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
	body, _ := json.Marshal(api.EnrollRequest{RunnerID: id, Pool: pool})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+api.RouteEnroll, bytes.NewReader(body))
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
		var e api.ErrorReply
		if json.Unmarshal(data, &e) == nil && e.Error.Message != "" {
			return nil, fmt.Errorf("enroll: %s", e.Error.Message)
		}
		return nil, fmt.Errorf("enroll: %s", resp.Status)
	}
	var reply api.EnrollReply
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

// renew renews the creds before they lapse until ctx ends, and then reconnects conns on the new
// ones. A failed renewal is tried again every tenth of the time left, at least every 5 s.
func (c *enrolledCreds) renew(ctx context.Context, log *slog.Logger, conns ...*nats.Conn) {
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
		for _, nc := range conns {
			if err := nc.ForceReconnect(); err != nil {
				log.Warn("reconnect on renewed creds", "conn", nc.Opts.Name, "err", err)
			}
		}
	}
}
