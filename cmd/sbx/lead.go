package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/httpapi"
	"github.com/sbx-dev/sbx/coordinator/mcp"
	"github.com/sbx-dev/sbx/coordinator/natsbus"
	"github.com/sbx-dev/sbx/coordinator/store"
	"github.com/sbx-dev/sbx/internal/jsready"
)

// serveCoordinator runs the coordinator until ctx ends, serving the API on api; it calls ready once
// calls to the API are answered (this coordinator leads, or one it forwards to does).
//
// Coordinators are active/standby (docs/decisions.md, "Several coordinators"): the one holding the
// lease (natsbus.Lease) runs the service and every duty that must happen once; the others forward
// the API to it. When the lease comes to this one, its forwarder hands the socket to the API
// (httpapi.Handoff). When the lease is lost (NATS out of reach past the step-down, the process
// frozen), the service stops, nothing of it is kept, and the coordinator is a standby again.
func serveCoordinator(ctx context.Context, nc *nats.Conn, cf coordinatorFlags, api *apiListener, local bool, log *slog.Logger, ready func()) error {
	id, err := coordinatorID(cf.data)
	if err != nil {
		return err
	}
	log = log.With("coordinator", id)
	var lease *natsbus.Lease
	if !waitJetStream(ctx, log, func(ctx context.Context) error {
		lease, err = natsbus.OpenLease(ctx, nc, natsbus.LeaseConfig{ID: id, URL: api.advertise, TTL: cf.leaseTTL, Replicas: cf.replicas, Logger: log})
		return err
	}) {
		return err
	}
	handoff, err := httpapi.NewHandoff(api.ln)
	if err != nil {
		return err
	}
	// Heard while a standby too, for a lead to start with (Bus.Replay).
	heard, err := natsbus.WatchHeartbeats(nc, cf.runnerDeadline)
	if err != nil {
		return err
	}
	defer heard.Stop()
	c := &coordinatorRole{id: id, lease: lease, handoff: handoff, heard: heard, ready: sync.OnceFunc(ready)}
	fcfg := api.cfg
	fcfg.Role = c.role
	go c.readyOnceLed(ctx)
	for {
		// A standby until the lease comes: the forwarder serves the socket.
		fwd := httpapi.NewForwarder(fcfg, c.leader)
		ln, err := handoff.Listener()
		if err != nil {
			return err
		}
		fwd.Open(ln)
		c.fwd = fwd
		err = lease.Run(ctx, func(ctx context.Context) error {
			log.Info("this coordinator leads")
			return c.lead(ctx, nc, cf, api, local, log)
		})
		c.serving.Store(false)
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), httpapi.ShutdownTimeout)
		if cerr := fwd.Close(shutdown); cerr != nil {
			log.Warn("closing the standby's forwarder", "err", cerr)
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, natsbus.ErrLeaseLost):
			// Cut off from NATS (or frozen) past the step-down: another coordinator may lead now.
			// This one stopped its service and serves as a standby again; a lease still its own
			// when NATS is back it takes back at once.
			log.Warn("this coordinator stopped leading; it forwards to the leader until it leads again", "err", err)
		case jsready.NotReady(err):
			// JetStream stopped answering while this coordinator led or took the lead (a NATS
			// server lost, its streams electing new leaders): it lets the lease go and tries again.
			log.Warn("this coordinator stopped leading: JetStream does not answer; it tries again", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(dialRetry):
			}
		default:
			return err
		}
	}
}

// coordinatorRole is a coordinator's part in the fleet: standby (fwd serves the socket) or leader.
type coordinatorRole struct {
	id      string
	lease   *natsbus.Lease
	handoff *httpapi.Handoff
	fwd     *httpapi.Server
	heard   *natsbus.Heartbeats
	ready   func()
	// serving is set once this coordinator's own API answers on the socket.
	serving atomic.Bool
}

// leader is the coordinator calls are forwarded to: the lease's holder; this coordinator itself
// only once its API serves (until then "": the forwarder answers 503, to be retried).
func (c *coordinatorRole) leader() (string, string) {
	id, url, ok := c.lease.Holder()
	if !ok || (id == c.id && !c.serving.Load()) {
		return id, ""
	}
	return id, url
}

func (c *coordinatorRole) role() (bool, string) {
	id, _, _ := c.lease.Holder()
	return c.lease.Leading(), id
}

// readyOnceLed calls ready once another coordinator is known to lead: this standby's calls are
// answered from then on. When this one leads, lead calls it.
func (c *coordinatorRole) readyOnceLed(ctx context.Context) {
	for {
		id, _, err := c.lease.WaitHolder(ctx)
		if err != nil {
			return
		}
		if id != c.id {
			c.ready()
			return
		}
		select { // this coordinator's own lease, from before a restart: lead calls ready
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// lead runs the service while this coordinator holds the lease: it makes the streams, loads the
// state from JetStream into the local cache, tells the service of the runners heard lately, takes
// the socket from the forwarder and serves.
func (c *coordinatorRole) lead(ctx context.Context, nc *nats.Conn, cf coordinatorFlags, api *apiListener, local bool, log *slog.Logger) error {
	db, err := store.Open(filepath.Join(cf.data, "sbx.db"))
	if err != nil {
		return err
	}
	defer db.Close()
	terms, err := store.OpenTerminals(filepath.Join(cf.data, "terminals"))
	if err != nil {
		return err
	}
	defer terms.Close()
	var bus *natsbus.Bus
	if !waitJetStream(ctx, log, func(ctx context.Context) error {
		bus, err = natsbus.New(ctx, nc, natsbus.Config{Replicas: cf.replicas, Logger: log})
		return err
	}) {
		return err
	}
	// The state lives in JetStream; sbx.db is its cache, made equal to it before the service reads it.
	state, err := natsbus.OpenState(ctx, nc, db, natsbus.StateConfig{Replicas: cf.replicas, RetainAge: cf.retainAge, Logger: log})
	if err != nil {
		return err
	}
	if err := state.Sync(ctx); err != nil {
		return err
	}
	// Output is kept until retention removes its job (no RetainAge): an age limit on the stream would
	// drop the first chunks of a job that ran longer than it while the job is still kept.
	out, err := natsbus.OpenOutput(ctx, nc, terms, natsbus.OutputConfig{Replicas: cf.replicas, Logger: log})
	if err != nil {
		return err
	}
	// The unfinished jobs' files get what the stream holds past them (written by the coordinator that
	// led before, or a data dir lost) before the service writes more.
	unfinished, err := state.UnfinishedJobs(ctx)
	if err != nil {
		return err
	}
	if err := out.Sync(ctx, unfinished); err != nil {
		return err
	}
	bus.SetOutput(out)
	svc, err := coordinator.New(ctx, coordinator.Config{
		CheckCwd: local, Logger: log, StallAfter: cf.stallAfter, InputStallAfter: cf.inputStallAfter, RunnerDeadline: cf.runnerDeadline, RetainAge: cf.retainAge, RetainBytes: api.retainBytes,
		OutputBudget: api.outputBudget, MinFreeBytes: api.minFreeDisk, Idempotency: bus,
	}, state, out, bus)
	if err != nil {
		return err
	}
	// The runners heard lately are known before the first call: ready, and readonly starts taken.
	bus.Replay(ctx, svc, c.heard)
	cfg := api.cfg
	cfg.Ready = bus.Ready
	cfg.Role = c.role
	mcpHTTP := mcp.NewHTTP(ctx, mcp.Config{MaxBlock: cf.mcpMaxBlock, Logger: log, Version: version}, cf.mcpSessions, httpapi.MaxBodyBytes)
	defer mcpHTTP.Close()
	cfg.Handlers = map[string]http.Handler{"/mcp": mcpHTTP}
	srv := httpapi.NewServer(svc, cfg)
	mcpHTTP.API = srv.Handler()

	// The forwarder lets the socket go and the API takes it; what the forwarder still holds is
	// forwarded to this coordinator once it serves (c.leader).
	if err := c.fwd.StopAccepting(); err != nil {
		return err
	}
	ln, err := c.handoff.Listener()
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return supervise(gctx, "service loop", func(ctx context.Context) error { svc.Run(ctx); return nil })
	})
	g.Go(func() error {
		return supervise(gctx, "event consumer", func(ctx context.Context) error { return bus.Consume(ctx, svc) })
	})
	g.Go(func() error {
		return supervise(gctx, "http api", func(ctx context.Context) error { return srv.Serve(ctx, ln) })
	})
	c.serving.Store(true)
	c.ready()
	return g.Wait()
}

// waitJetStream calls open until it succeeds, waiting while JetStream cannot answer yet (a server
// just started, a cluster electing its leader, too few of its servers up for the replicas yet) and
// saying so, with the cause, every dialNotice. It reports false when open was refused (its error is
// open's to keep) or ctx ended first.
func waitJetStream(ctx context.Context, log *slog.Logger, open func(context.Context) error) bool {
	var said time.Time
	for {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := open(octx)
		cancel()
		if err == nil {
			return true
		}
		if ctx.Err() != nil || !jsready.NotReady(err) {
			return false
		}
		if time.Since(said) >= dialNotice {
			log.Warn("waiting for JetStream", "err", err)
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(dialRetry):
		}
	}
}

// coordinatorID is this coordinator's id in the lease, kept in the data dir: a coordinator that
// restarts takes its lease back at once instead of waiting for it to lapse (natsbus.Lease).
func coordinatorID(data string) (string, error) {
	path := filepath.Join(data, "coordinator-id")
	b, err := os.ReadFile(path)
	if err == nil {
		if id := strings.TrimSpace(string(b)); id != "" {
			return id, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("coordinator id: %w", err)
	}
	var r [4]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	// The host's name makes /readyz's leader_id readable; the random part makes it unique.
	id := hex.EncodeToString(r[:])
	if host, err := os.Hostname(); err == nil && validLabelKey(host) {
		id = host + "-" + id
	}
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("coordinator id: %w", err)
	}
	return id, nil
}
