package natsbus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/internal/poll"
)

// testTTL is short so that the tests take seconds; the timings scale with it.
const testTTL = 400 * time.Millisecond

// leadSpan is one term as its lead saw it: from the call to the end of its context.
type leadSpan struct {
	id       string
	from, to time.Time
}

// leads records the terms of several leases, to show that no two overlapped.
type leads struct {
	mu    sync.Mutex
	spans []leadSpan
	open  map[string]time.Time
}

// lead is a lead that runs until its context ends, recorded under id.
func (r *leads) lead(id string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		r.mu.Lock()
		if r.open == nil {
			r.open = map[string]time.Time{}
		}
		r.open[id] = time.Now()
		r.mu.Unlock()
		<-ctx.Done()
		r.mu.Lock()
		r.spans = append(r.spans, leadSpan{id: id, from: r.open[id], to: time.Now()})
		delete(r.open, id)
		r.mu.Unlock()
		return nil
	}
}

// leaders returns the ids whose lead runs now.
func (r *leads) leaders() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for id := range r.open {
		ids = append(ids, id)
	}
	return ids
}

// checkNoOverlap fails t when two terms, ended or not, overlapped.
func (r *leads) checkNoOverlap(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	spans := slices.Clone(r.spans)
	for id, from := range r.open {
		spans = append(spans, leadSpan{id: id, from: from, to: time.Now()})
	}
	r.mu.Unlock()
	slices.SortFunc(spans, func(a, b leadSpan) int { return a.from.Compare(b.from) })
	for i := 1; i < len(spans); i++ {
		if a, b := spans[i-1], spans[i]; b.from.Before(a.to) {
			t.Errorf("%s led from %s while %s led until %s (overlap %s)", b.id, b.from.Format("15:04:05.000"),
				a.id, a.to.Format("15:04:05.000"), a.to.Sub(b.from))
		}
	}
}

// running is a Run in progress.
type running struct {
	lease  *Lease
	cancel context.CancelFunc
	done   chan error
	// started is when Run was called.
	started time.Time
}

// startLease opens a lease of id on nc and runs it with lead.
func startLease(t *testing.T, nc *nats.Conn, cfg LeaseConfig, lead func(context.Context) error) *running {
	t.Helper()
	l, err := OpenLease(t.Context(), nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	r := &running{lease: l, cancel: cancel, done: make(chan error, 1), started: time.Now()}
	go func() { r.done <- l.Run(ctx, lead) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Errorf("the Run of %s did not end", cfg.ID)
		}
	})
	return r
}

// wait returns Run's error, failing t when it did not return within d.
func (r *running) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(d):
		t.Fatalf("Run did not return within %s", d)
		return nil
	}
}

func connect(t *testing.T, urls string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	return natstest.Connect(t, urls, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)...)
}

// TestLeaseOneLeads: of two leases one leads, both see it as the holder; when its Run's context
// ends the other takes over (at once: the leaver deletes the key), and a lead's own error is what
// Run returns.
func TestLeaseOneLeads(t *testing.T) {
	ns := natstest.Server(t)
	var rec leads
	a := startLease(t, connect(t, ns.ClientURL()), LeaseConfig{ID: "a", URL: "http://a", TTL: testTTL}, rec.lead("a"))
	b := startLease(t, connect(t, ns.ClientURL()), LeaseConfig{ID: "b", URL: "http://b", TTL: testTTL}, rec.lead("b"))

	poll.Until(t, 5*time.Second, "a leader", func() bool { return len(rec.leaders()) == 1 })
	first := rec.leaders()[0]
	leader, standby := a, b
	if first == "b" {
		leader, standby = b, a
	}
	// Renewals keep it: over three TTLs no takeover, and each lease says who leads.
	deadline := time.Now().Add(3 * testTTL)
	for time.Now().Before(deadline) {
		if ids := rec.leaders(); len(ids) != 1 || ids[0] != first {
			t.Fatalf("leaders %v, want [%s] only", ids, first)
		}
		if !leader.lease.Leading() || standby.lease.Leading() {
			t.Fatalf("Leading: %s %v, the other %v", first, leader.lease.Leading(), standby.lease.Leading())
		}
		time.Sleep(20 * time.Millisecond) // between looks at a window in which nothing may change
	}
	for _, r := range []*running{a, b} {
		id, url, err := r.lease.WaitHolder(t.Context())
		if err != nil || id != first || url != "http://"+first {
			t.Errorf("WaitHolder: %q %q %v, want %s", id, url, err, first)
		}
	}

	stopped := time.Now()
	leader.cancel()
	if err := leader.wait(t, testTTL); !errors.Is(err, context.Canceled) {
		t.Errorf("Run of the leader whose context ended: %v, want context.Canceled", err)
	}
	took := poll.Until(t, testTTL+testTTL/4+200*time.Millisecond, "the standby takes over", func() bool {
		ids := rec.leaders()
		return len(ids) == 1 && ids[0] != first
	})
	t.Logf("took over %s after the leader's context ended (%s of waiting)", time.Since(stopped), took)
	poll.Until(t, time.Second, "Holder names the new leader", func() bool {
		id, _, ok := standby.lease.Holder()
		return ok && id != first
	})
	rec.checkNoOverlap(t)

	// A lead that fails: Run returns its error.
	boom := errors.New("boom")
	c := startLease(t, connect(t, ns.ClientURL()), LeaseConfig{ID: "c", TTL: testTTL}, func(ctx context.Context) error { return boom })
	standby.cancel()
	if err := c.wait(t, 5*time.Second); !errors.Is(err, boom) {
		t.Errorf("Run of a lead that failed: %v, want %v", err, boom)
	}
}

// TestLeaseHolderDies: a holder that can no longer reach NATS (its connection closed, as by a kill)
// steps down within TTL/2, before the other takes over; the other does within TTL and a renewal
// of the last write.
func TestLeaseHolderDies(t *testing.T) {
	ns := natstest.Server(t)
	var rec leads
	anc := connect(t, ns.ClientURL())
	a := startLease(t, anc, LeaseConfig{ID: "a", TTL: testTTL}, rec.lead("a"))
	poll.Until(t, 5*time.Second, "a leads", func() bool { return a.lease.Leading() })
	b := startLease(t, connect(t, ns.ClientURL()), LeaseConfig{ID: "b", TTL: testTTL}, rec.lead("b"))
	poll.Until(t, 5*time.Second, "b sees a", func() bool { id, _, ok := b.lease.Holder(); return ok && id == "a" })

	cut := time.Now()
	anc.Close()
	if err := a.wait(t, testTTL); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("Run of a leader cut off: %v, want ErrLeaseLost", err)
	}
	if a.lease.Leading() {
		t.Error("a still says it leads")
	}
	poll.Until(t, testTTL+testTTL/4+300*time.Millisecond, "b takes over", func() bool { return b.lease.Leading() })
	t.Logf("b took over %s after a was cut off", time.Since(cut))
	rec.checkNoOverlap(t)
}

// TestLeaseRestartTakesBack: a coordinator restarted under the holder's ID takes the lease back at
// once, where a coordinator of another ID waits for the TTL.
func TestLeaseRestartTakesBack(t *testing.T) {
	ns := natstest.Server(t)
	var rec leads
	anc := connect(t, ns.ClientURL())
	a := startLease(t, anc, LeaseConfig{ID: "a", TTL: testTTL}, rec.lead("a"))
	poll.Until(t, 5*time.Second, "a leads", func() bool { return a.lease.Leading() })
	anc.Close()
	if err := a.wait(t, testTTL); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Run of a leader cut off: %v, want ErrLeaseLost", err)
	}

	b := startLease(t, connect(t, ns.ClientURL()), LeaseConfig{ID: "b", TTL: testTTL}, rec.lead("b"))
	again := startLease(t, connect(t, ns.ClientURL()), LeaseConfig{ID: "a", TTL: testTTL}, rec.lead("a again"))
	took := poll.Until(t, testTTL/2, "a, restarted, leads", func() bool { return again.lease.Leading() })
	t.Logf("the restarted a leads %s after it started", took)
	// Renewed, the lease stays with it.
	time.Sleep(2 * testTTL)
	if b.lease.Leading() || !again.lease.Leading() {
		t.Errorf("Leading: b %v, a again %v", b.lease.Leading(), again.lease.Leading())
	}
	rec.checkNoOverlap(t)
}

// TestLeaseNodeLoss: on a 3-server cluster, with 3 replicas, the holder connected to one server
// only is cut off when that server shuts down: it steps down before the other, connected to the
// two others, takes over.
func TestLeaseNodeLoss(t *testing.T) {
	cluster := natstest.StartCluster(t, 3)
	// A TTL that the cluster's renewals fit with room while the servers share two cores.
	const ttl = time.Second
	var rec leads
	s1 := cluster.Server("s1")
	// Told of s1 alone, and deaf to the servers s1 names: cut off once s1 is gone.
	a := startLease(t, connect(t, s1.ClientURL(), nats.IgnoreDiscoveredServers()), LeaseConfig{ID: "a", TTL: ttl, Replicas: 3}, rec.lead("a"))
	poll.Until(t, 10*time.Second, "a leads", func() bool { return a.lease.Leading() })
	others := cluster.Server("s2").ClientURL() + "," + cluster.Server("s3").ClientURL()
	b := startLease(t, connect(t, others), LeaseConfig{ID: "b", TTL: ttl, Replicas: 3}, rec.lead("b"))
	poll.Until(t, 10*time.Second, "b sees a", func() bool { id, _, ok := b.lease.Holder(); return ok && id == "a" })

	cut := time.Now()
	s1.Shutdown()
	s1.WaitForShutdown()
	if err := a.wait(t, ttl); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("Run of the leader whose server shut down: %v, want ErrLeaseLost", err)
	}
	// The bucket's stream may have had its leader on s1: the takeover waits for a new one too.
	poll.Until(t, 15*time.Second, "b takes over", func() bool { return b.lease.Leading() })
	t.Logf("b took over %s after s1 shut down", time.Since(cut))
	rec.checkNoOverlap(t)
}

// TestLeaseRefusesOtherReplicas: the bucket's replica count is not changed in place.
func TestLeaseRefusesOtherReplicas(t *testing.T) {
	nc := natstest.Conn(t)
	if _, err := OpenLease(t.Context(), nc, LeaseConfig{ID: "a"}); err != nil {
		t.Fatal(err)
	}
	_, err := OpenLease(t.Context(), nc, LeaseConfig{ID: "a", Replicas: 3})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("KV_%s has 1 replicas, not 3", LeaseBucket)) {
		t.Errorf("a lease of 3 replicas over a bucket of 1: %v", err)
	}
	if _, err := OpenLease(t.Context(), nc, LeaseConfig{}); err == nil || !strings.Contains(err.Error(), "LeaseConfig.ID") {
		t.Errorf("a lease without an ID: %v", err)
	}
}

// TestLeaseWaitHolder: WaitHolder blocks while no coordinator holds the lease, and returns the
// first that does.
func TestLeaseWaitHolder(t *testing.T) {
	ns := natstest.Server(t)
	l, err := OpenLease(t.Context(), connect(t, ns.ClientURL()), LeaseConfig{ID: "standby", TTL: testTTL})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := l.Holder(); ok {
		t.Error("a holder before any Run")
	}
	ctx, cancel := context.WithTimeout(t.Context(), testTTL)
	defer cancel()
	if id, _, err := l.WaitHolder(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitHolder with no holder: %q %v, want DeadlineExceeded", id, err)
	}
	got := make(chan string, 1)
	go func() {
		id, url, err := l.WaitHolder(t.Context())
		got <- fmt.Sprintf("%s %s %v", id, url, err)
	}()
	var rec leads
	startLease(t, connect(t, ns.ClientURL()), LeaseConfig{ID: "a", URL: "http://a", TTL: testTTL}, rec.lead("a"))
	select {
	case g := <-got:
		if g != "a http://a <nil>" {
			t.Errorf("WaitHolder: %s", g)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitHolder did not return once a leads")
	}
	if l.Leading() {
		t.Error("a lease that never ran leads")
	}
}

// takeoverAfter returns how long the key held by from stayed unchanged, as b saw it, before b led:
// it follows b's view of the key until b leads.
func takeoverAfter(t *testing.T, b *running, from string, within time.Duration) time.Duration {
	t.Helper()
	var last time.Time
	poll.Until(t, within, "b takes over", func() bool {
		b.lease.mu.Lock()
		s := b.lease.seen
		b.lease.mu.Unlock()
		if s.ok && s.rec.ID == from {
			last = s.at
		}
		return b.lease.Leading()
	})
	if last.IsZero() {
		t.Fatalf("b never saw %s hold the key", from)
	}
	return time.Since(last)
}

// TestLeaseHolderGoneEarly: a holder whose connection is gone from NATS (a killed process) is taken
// over once the key stayed unchanged past the holder's own step-down, before the TTL.
func TestLeaseHolderGoneEarly(t *testing.T) {
	ns := natstest.Server(t)
	const ttl = 2 * time.Second
	var rec leads
	anc := connect(t, ns.ClientURL())
	a := startLease(t, anc, LeaseConfig{ID: "a", TTL: ttl}, rec.lead("a"))
	poll.Until(t, 5*time.Second, "a leads", func() bool { return a.lease.Leading() })
	b := startLease(t, connect(t, ns.ClientURL()), LeaseConfig{ID: "b", TTL: ttl}, rec.lead("b"))
	poll.Until(t, 5*time.Second, "b sees a", func() bool { id, _, ok := b.lease.Holder(); return ok && id == "a" })

	anc.Close()
	took := takeoverAfter(t, b, "a", 5*time.Second)
	t.Logf("b took over the key unchanged for %s (early %s, TTL %s)", took.Round(time.Millisecond), earlyTakeover(ttl), ttl)
	if took >= ttl*9/10 {
		t.Errorf("b took over after %s unchanged: not before the TTL %s", took, ttl)
	}
	if err := a.wait(t, ttl); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("Run of a leader cut off: %v, want ErrLeaseLost", err)
	}
	rec.checkNoOverlap(t)
}

// TestLeaseStalledHolderWaitsTTL: a holder whose connection NATS still has, but which answers
// nothing (frozen, or its link stalled), is not taken over early: its Alive subject times out, and
// the candidate waits out the TTL.
func TestLeaseStalledHolderWaitsTTL(t *testing.T) {
	ns := natstest.Server(t)
	const ttl = 2 * time.Second
	var rec leads
	proxy := natstest.NewStallProxy(t, strings.TrimPrefix(ns.ClientURL(), "nats://"))
	a := startLease(t, connect(t, proxy.URL()), LeaseConfig{ID: "a", TTL: ttl}, rec.lead("a"))
	poll.Until(t, 5*time.Second, "a leads", func() bool { return a.lease.Leading() })
	b := startLease(t, connect(t, ns.ClientURL()), LeaseConfig{ID: "b", TTL: ttl}, rec.lead("b"))
	poll.Until(t, 5*time.Second, "b sees a", func() bool { id, _, ok := b.lease.Holder(); return ok && id == "a" })

	proxy.Stall()
	took := takeoverAfter(t, b, "a", 5*time.Second)
	t.Logf("b took over the key unchanged for %s (TTL %s)", took.Round(time.Millisecond), ttl)
	if took < ttl {
		t.Errorf("b took over a holder still connected after %s unchanged, before the TTL %s", took, ttl)
	}
	proxy.Resume()
	rec.checkNoOverlap(t)
}
