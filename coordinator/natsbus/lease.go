package natsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The lease that chooses the one coordinator running the duties that must happen once (lost-runner
// detection and fencing, timeouts, debounce windows, stall checks, session leases, retention): the
// key leaseKey of the bucket LeaseBucket holds its holder; docs/decisions.md, "The leader lease".
const (
	LeaseBucket     = "SBX_LEASE"
	DefaultLeaseTTL = 3 * time.Second
	// minLeaseTTL is the shortest TTL taken: a renewal (a quarter of it) must fit a round trip to
	// the stream's leader.
	minLeaseTTL = 100 * time.Millisecond
	leaseKey    = "leader"
)

// ErrLeaseLost is what Run returns, wrapped, when its holder lost the lease while leading: it could
// not renew it for half the TTL, or another coordinator holds it.
var ErrLeaseLost = errors.New("the leader lease was lost")

// LeaseConfig configures a lease; zero fields take their defaults.
type LeaseConfig struct {
	// ID names this coordinator; one process at a time may use it: a coordinator that finds its
	// own ID in the key takes the lease back at once, as a restart of the holder.
	ID string
	// URL is where the other coordinators reach this one's API while it leads.
	URL string
	// TTL (DefaultLeaseTTL): the holder renews every TTL/4 and steps down when it could not for
	// TTL/2; another takes over once the key stayed unchanged for TTL, or for earlyTakeover(TTL)
	// when the holder's connection is gone from NATS.
	TTL time.Duration
	// Replicas of the bucket (1); an existing bucket with another count is refused (checkReplicas).
	Replicas int
	Logger   *slog.Logger
}

// leaseRecord is the key's value. Since marks the term: renewals keep it, so that a holder can
// tell its own write from a restarted process's under the same ID. Alive is the subject the holder
// answers on for the term, on the connection it writes with (an inbox of its own); empty in a
// record written by a coordinator older than the early takeover.
type leaseRecord struct {
	ID    string    `json:"id"`
	URL   string    `json:"url"`
	Since time.Time `json:"since"`
	Alive string    `json:"alive,omitempty"`
}

// earlyTakeover is how long a key must stay unchanged before a candidate takes it over from a
// holder whose connection NATS says is gone (holderGone): past the holder's own step-down (TTL/2
// after it sent its last renewal, which is before any candidate saw it) by a margin for timers
// that fire late and clocks that run at slightly different rates.
func earlyTakeover(ttl time.Duration) time.Duration { return ttl/2 + ttl/10 }

// sameTerm reports whether r and o are one holder's one term.
func (r leaseRecord) sameTerm(o leaseRecord) bool { return r.ID == o.ID && r.Since.Equal(o.Since) }

// leaseSeen is the key as this process last saw it: its revision, and when this process first saw
// that revision, by its own clock. ok is false while the key is known to be absent.
type leaseSeen struct {
	rec leaseRecord
	rev uint64
	at  time.Time
	ok  bool
}

// Lease is one coordinator's part in the leader lease: Run campaigns for it and holds it, Holder
// and WaitHolder tell the other coordinators whom to forward to.
type Lease struct {
	cfg LeaseConfig
	nc  *nats.Conn
	kv  jetstream.KeyValue

	mu   sync.Mutex
	seen leaseSeen
	// leading holds while Run's lead runs on a lease held, until, the step-down instant.
	leading bool
	until   time.Time
	// changed is closed, and replaced, whenever seen changes.
	changed chan struct{}
}

// OpenLease makes sure of the bucket and watches the key, for Holder and WaitHolder, until ctx ends
// (or nc closes): ctx is the lease's life, not a bound on opening it.
func OpenLease(ctx context.Context, nc *nats.Conn, cfg LeaseConfig) (*Lease, error) {
	if cfg.ID == "" {
		return nil, errors.New("LeaseConfig.ID is empty")
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultLeaseTTL
	}
	if cfg.TTL < minLeaseTTL {
		return nil, fmt.Errorf("LeaseConfig.TTL %s is below %s", cfg.TTL, minLeaseTTL)
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	kv, _, err := bucket(ctx, js, LeaseBucket, 0, cfg.Replicas, ", or delete the bucket "+LeaseBucket+" (nothing is lost: the lease forms again) and start again")
	if err != nil {
		return nil, err
	}
	w, err := kv.Watch(ctx, leaseKey)
	if err != nil {
		return nil, fmt.Errorf("watch %s %s: %w", LeaseBucket, leaseKey, err)
	}
	l := &Lease{cfg: cfg, nc: nc, kv: kv, changed: make(chan struct{})}
	go l.watch(w)
	return l, nil
}

// watch feeds the key's changes to seen until the watch ends (its context, or the connection).
// JetStream's watch may lag, or stall while it re-creates its consumer after a server's loss: the
// campaign reads the key itself too, and a late view only delays a takeover.
func (l *Lease) watch(w jetstream.KeyWatcher) {
	for e := range w.Updates() {
		if e == nil {
			continue // the initial values are all in
		}
		l.observe(e)
	}
}

// observe records an entry of the key, unless seen already holds that revision or a later one.
func (l *Lease) observe(e jetstream.KeyValueEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.Revision() <= l.seen.rev {
		return
	}
	s := leaseSeen{rev: e.Revision(), at: time.Now()}
	if e.Operation() == jetstream.KeyValuePut {
		s.ok = true
		if err := json.Unmarshal(e.Value(), &s.rec); err != nil {
			// Kept as a holder of no known ID: it is taken over once it stays unchanged for the TTL.
			l.cfg.Logger.Warn("leader lease: undecodable value", "revision", e.Revision(), "err", err)
		}
	}
	l.set(s)
}

// set replaces seen and wakes its waiters; l.mu is held.
func (l *Lease) set(s leaseSeen) {
	l.seen = s
	close(l.changed)
	l.changed = make(chan struct{})
}

// Holder returns the holder last seen in the key; ok is false while none is known. A holder that
// died stays the one seen until another takes over.
func (l *Lease) Holder() (id, url string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seen.rec.ID, l.seen.rec.URL, l.seen.ok
}

// WaitHolder blocks until some holder is known, and returns it.
func (l *Lease) WaitHolder(ctx context.Context) (id, url string, err error) {
	for {
		l.mu.Lock()
		s, changed := l.seen, l.changed
		l.mu.Unlock()
		if s.ok {
			return s.rec.ID, s.rec.URL, nil
		}
		select {
		case <-ctx.Done():
			return "", "", ctx.Err()
		case <-changed:
		}
	}
}

// Leading reports whether this process holds the lease and its lead runs. It checks the clock too:
// a process frozen past its step-down (SIGSTOP, a VM pause) stops leading the moment it resumes,
// before its step-down timer has run.
func (l *Lease) Leading() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leading && time.Now().Before(l.until)
}

// setLeading records whether lead runs, and its step-down instant.
func (l *Lease) setLeading(leading bool, until time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leading, l.until = leading, until
}

// term is a lease held: its record, the revision of its last write, when that write was sent,
// and the subscription that answers on rec.Alive while the term lasts.
type term struct {
	rec     leaseRecord
	rev     uint64
	renewed time.Time
	alive   *nats.Subscription
}

// Run campaigns until it holds the lease, then calls lead once with a context that ends when the
// lease is lost (or ctx ends). lead must return once its duties have stopped. Run returns lead's
// error, or an error wrapping ErrLeaseLost when the lease was lost, or ctx.Err(). Leaving with the
// lease still held (ctx ended, lead returned), it deletes the key, so that another takes over at once.
func (l *Lease) Run(ctx context.Context, lead func(ctx context.Context) error) error {
	t, err := l.campaign(ctx)
	if err != nil {
		return err
	}
	return l.hold(ctx, t, lead)
}

// campaign reads the key every TTL/4, on every change the watch sees, and when the holder seen
// would have been unchanged for earlyTakeover (when it names an Alive subject) and for TTL; it
// returns once a write of its own made it the holder.
func (l *Lease) campaign(ctx context.Context) (*term, error) {
	poll := time.NewTicker(l.cfg.TTL / 4)
	defer poll.Stop()
	expire := time.NewTimer(l.cfg.TTL)
	defer expire.Stop()
	failing := false
	for {
		t, err := l.try(ctx)
		if t != nil {
			return t, nil
		}
		// Logged when it starts failing and when it works again, not at every poll.
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			l.cfg.Logger.Warn("leader lease: campaign failing", "err", err)
			failing = true
		case err == nil && failing:
			l.cfg.Logger.Info("leader lease: campaign works again")
			failing = false
		}
		l.mu.Lock()
		s, changed := l.seen, l.changed
		l.mu.Unlock()
		// A holder already past its TTL whose takeover failed is tried again at the next poll.
		if wait := l.nextTry(s); wait > 0 {
			expire.Reset(wait)
		} else {
			expire.Stop()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-poll.C:
		case <-changed:
		case <-expire.C:
		}
	}
}

// nextTry is how long until the key seen, unchanged, may be taken over: 0 when there is no such
// moment ahead (absent, or past the TTL already).
func (l *Lease) nextTry(s leaseSeen) time.Duration {
	if !s.ok {
		return 0
	}
	if s.rec.Alive != "" {
		if wait := time.Until(s.at.Add(earlyTakeover(l.cfg.TTL))); wait > 0 {
			return wait
		}
	}
	return max(time.Until(s.at.Add(l.cfg.TTL)), 0)
}

// try reads the key and writes this process's record when the key is absent, names this process's
// ID (a restart of the holder), or has stayed unchanged for TTL since this process first saw it. By
// this process's clock alone: the holder stops at TTL/2 by its own, so no clocks need to agree, only
// to run at about the same rate. The write is at the revision seen, so of several candidates one
// wins, and none wins over a holder that renewed in the meantime.
//
// A key unchanged for earlyTakeover only is taken over when NATS answers that nobody listens on its
// Alive subject: the holder's connection is gone (a killed process, a lost host), so it cannot renew
// and will not. A holder that is merely slow (its renewals held up, a stream electing its leader) or
// frozen still has its connection and keeps its subscription, the request then times out, and the
// candidate waits the TTL as before, which lets such a holder take its own ID's lease back first.
func (l *Lease) try(ctx context.Context) (*term, error) {
	rctx, cancel := context.WithTimeout(ctx, l.cfg.TTL/4)
	e, err := l.kv.Get(rctx, leaseKey)
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return l.write(ctx, 0)
	case err != nil:
		return nil, fmt.Errorf("read %s %s: %w", LeaseBucket, leaseKey, err)
	}
	l.observe(e)
	l.mu.Lock()
	s := l.seen
	l.mu.Unlock()
	switch {
	case !s.ok:
		return l.write(ctx, 0)
	case s.rec.ID == l.cfg.ID:
		l.cfg.Logger.Info("leader lease: taking back the lease of my ID", "since", s.rec.Since)
		return l.write(ctx, s.rev)
	case time.Since(s.at) >= l.cfg.TTL:
		l.cfg.Logger.Info("leader lease: taking over", "from", s.rec.ID, "unchanged_for", time.Since(s.at).Round(time.Millisecond))
		return l.write(ctx, s.rev)
	case s.rec.Alive != "" && time.Since(s.at) >= earlyTakeover(l.cfg.TTL) && l.holderGone(ctx, s.rec.Alive):
		l.cfg.Logger.Info("leader lease: taking over from a holder gone from NATS", "from", s.rec.ID, "unchanged_for", time.Since(s.at).Round(time.Millisecond))
		return l.write(ctx, s.rev)
	}
	return nil, nil
}

// holderGone asks the holder's Alive subject, and reports whether NATS answered that nobody
// subscribes to it. Any other outcome (an answer, a timeout, this process's own connection down)
// is not proof.
func (l *Lease) holderGone(ctx context.Context, subject string) bool {
	rctx, cancel := context.WithTimeout(ctx, l.cfg.TTL/4)
	defer cancel()
	_, err := l.nc.RequestWithContext(rctx, subject, nil)
	return errors.Is(err, nats.ErrNoResponders)
}

// write makes this process the holder with a new term: KV Create when rev is 0, else Update at rev.
// It returns nil, with no error, when another write came first.
//
// The term's Alive subscription is made first, on the connection the write goes over: the server
// has it before the write, so no candidate finds the subject unheard while the term is new.
func (l *Lease) write(ctx context.Context, rev uint64) (t *term, err error) {
	rec := leaseRecord{ID: l.cfg.ID, URL: l.cfg.URL, Since: time.Now().UTC(), Alive: l.nc.NewInbox()}
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encode lease: %w", err)
	}
	alive, err := l.nc.Subscribe(rec.Alive, func(m *nats.Msg) { _ = m.Respond(nil) })
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", rec.Alive, err)
	}
	defer func() {
		if t == nil {
			_ = alive.Unsubscribe()
		}
	}()
	wctx, cancel := context.WithTimeout(ctx, l.cfg.TTL/4)
	defer cancel()
	sent := time.Now()
	if rev == 0 {
		rev, err = l.kv.Create(wctx, leaseKey, data)
	} else {
		rev, err = l.kv.Update(wctx, leaseKey, data, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || wrongRevision(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("write %s %s: %w", LeaseBucket, leaseKey, err)
	}
	l.mu.Lock()
	if rev > l.seen.rev {
		l.set(leaseSeen{rec: rec, rev: rev, at: time.Now(), ok: true})
	}
	l.mu.Unlock()
	return &term{rec: rec, rev: rev, renewed: sent, alive: alive}, nil
}

// hold runs lead while it renews t every TTL/4, with KV Update at its last revision. TTL/2 after the
// last renewal that succeeded was sent, lead's context ends: a candidate takes over no earlier than
// TTL after it saw that write, which came after it was sent, so lead has TTL/2 to stop first.
//
// The term's Alive subscription lasts until lead has returned: while it answers, no candidate takes
// over before the TTL.
func (l *Lease) hold(ctx context.Context, t *term, lead func(ctx context.Context) error) error {
	defer func() { _ = t.alive.Unsubscribe() }()
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	l.setLeading(true, t.renewed.Add(l.cfg.TTL/2))
	defer l.setLeading(false, time.Time{})
	l.cfg.Logger.Info("leader lease: leading", "id", t.rec.ID, "revision", t.rev)
	stepDown := func(cause error) {
		l.setLeading(false, time.Time{})
		cancel(cause)
	}
	// The step-down is a timer of its own so that it is on time even while a renewal blocks.
	timer := time.AfterFunc(time.Until(t.renewed.Add(l.cfg.TTL/2)), func() {
		stepDown(fmt.Errorf("%w: not renewed for %s", ErrLeaseLost, l.cfg.TTL/2))
	})
	done := make(chan error, 1)
	go func() { done <- lead(lctx) }()
	renew := time.NewTicker(l.cfg.TTL / 4)
	defer renew.Stop()
	renewC, lost := renew.C, lctx.Done()
	for {
		select {
		case err := <-done:
			held := timer.Stop()
			if cause := context.Cause(lctx); errors.Is(cause, ErrLeaseLost) {
				l.cfg.Logger.Warn("leader lease: stepped down", "err", cause)
				return cause
			}
			if held {
				l.release(ctx, t)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		case <-lost:
			// Stopped: no more renewals, lead is on its way out.
			renewC, lost = nil, nil
		case <-renewC:
			if err := l.renew(lctx, t, timer); err != nil {
				stepDown(err)
			}
		}
	}
}

// renew writes t's record again at t's revision, and on success moves the step-down to TTL/2 after
// the write was sent. It returns an error wrapping ErrLeaseLost when another holds the lease;
// other failures are logged, the step-down timer being the bound on them.
func (l *Lease) renew(ctx context.Context, t *term, timer *time.Timer) error {
	data, err := json.Marshal(t.rec)
	if err != nil {
		return fmt.Errorf("%w: encode lease: %v", ErrLeaseLost, err)
	}
	// Past the step-down a renewal is of no use.
	wctx, cancel := context.WithDeadline(ctx, t.renewed.Add(l.cfg.TTL/2))
	defer cancel()
	sent := time.Now()
	rev, err := l.kv.Update(wctx, leaseKey, data, t.rev)
	if wrongRevision(err) {
		// A renewal whose reply was lost may have been written: then the key holds this term.
		e, gerr := l.kv.Get(wctx, leaseKey)
		if gerr != nil {
			l.cfg.Logger.Warn("leader lease: renewal refused, the key unreadable", "err", gerr)
			return nil
		}
		var rec leaseRecord
		if json.Unmarshal(e.Value(), &rec) != nil || !rec.sameTerm(t.rec) {
			return fmt.Errorf("%w: %s holds it since %s", ErrLeaseLost, rec.ID, rec.Since.Format(time.RFC3339Nano))
		}
		// When it was written is unknown: the step-down stays where it was.
		t.rev = e.Revision()
		return nil
	}
	if err != nil {
		if ctx.Err() == nil {
			l.cfg.Logger.Warn("leader lease: renewal failed", "err", err)
		}
		return nil
	}
	if !timer.Stop() {
		return nil // stepped down already
	}
	t.rev, t.renewed = rev, sent
	l.setLeading(true, sent.Add(l.cfg.TTL/2))
	timer.Reset(time.Until(sent.Add(l.cfg.TTL / 2)))
	return nil
}

// release deletes the key at t's revision as its holder leaves, lead having returned: the others
// need not wait out the TTL. A failure leaves them to.
func (l *Lease) release(ctx context.Context, t *term) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.TTL/4)
	defer cancel()
	if err := l.kv.Delete(rctx, leaseKey, jetstream.LastRevision(t.rev)); err != nil {
		l.cfg.Logger.Info("leader lease: not released, the others wait out the TTL", "err", err)
		return
	}
	l.cfg.Logger.Info("leader lease: released", "id", t.rec.ID)
}
