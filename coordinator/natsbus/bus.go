// Package natsbus is the coordinator's NATS side: it creates the streams, queues work, withdraws it,
// sends control requests to runners and feeds the runners' events and heartbeats to the coordinator.
package natsbus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/proto"
)

// Config sizes the streams; zero fields take their defaults.
type Config struct {
	// Replicas of each stream on a NATS cluster (1). A count above 1 needs a clustered NATS with
	// at least that many JetStream servers (replicasError). An existing stream with another count
	// is refused, not changed (checkReplicas).
	Replicas int
	// EventBytes bounds the event stream (2 GiB). When it is full runners stop reading their jobs'
	// output until the coordinator catches up: nothing is dropped.
	EventBytes int64
	// WorkMessages bounds the number of queued jobs (100000).
	WorkMessages int64
	// ControlTimeout bounds a control request to a runner (5 s).
	ControlTimeout time.Duration
	// PublishTimeout bounds the wait for the work stream to confirm a job was queued (5 s). Past it
	// the start is refused; the work's NotAfter is the same instant, so a runner that takes it later
	// asks the coordinator first (proto.ConfirmSubject).
	PublishTimeout time.Duration
	// ConsumerHeartbeat is how often the server shows the event consumer is alive while no event
	// comes (5 s); after two missed ones Consume checks the consumer still exists.
	ConsumerHeartbeat time.Duration
	// MaxWorkConsumers bounds the work consumers the coordinator creates (512): a runner names its
	// pool in its heartbeats, and a runner's creds must not make the coordinator create them without end.
	MaxWorkConsumers int
	// MaxPoolsPerRunner bounds the pools one runner may name in its heartbeats within
	// WorkConsumerIdle (4): a heartbeat naming one more is dropped and counted as forged. Runner
	// creds minted for a pool name only it; creds for any pool are held to this bound.
	MaxPoolsPerRunner int
	// WorkConsumerIdle is how long a pool's work consumers stay once no runner's heartbeat and no
	// dispatch names the pool (10 min); then they are removed (the queued work stays).
	WorkConsumerIdle time.Duration
	// EventMaxAge bounds how long an event stays in the event stream unconsumed (7 days): whatever
	// the coordinator cannot apply by then is dropped rather than kept for ever.
	EventMaxAge time.Duration
	// IdempotencyBytes bounds the bucket of idempotency keys (256 MiB: a million keys); when it
	// is full, starts with a new key are refused until keys expire.
	IdempotencyBytes int64
	Logger           *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.EventBytes == 0 {
		c.EventBytes = 2 << 30
	}
	if c.WorkMessages == 0 {
		c.WorkMessages = 100_000
	}
	if c.ControlTimeout == 0 {
		c.ControlTimeout = 5 * time.Second
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = 5 * time.Second
	}
	if c.ConsumerHeartbeat == 0 {
		c.ConsumerHeartbeat = 5 * time.Second
	}
	if c.MaxWorkConsumers == 0 {
		c.MaxWorkConsumers = 512
	}
	if c.MaxPoolsPerRunner == 0 {
		c.MaxPoolsPerRunner = 4
	}
	if c.WorkConsumerIdle == 0 {
		c.WorkConsumerIdle = 10 * time.Minute
	}
	if c.EventMaxAge == 0 {
		c.EventMaxAge = 7 * 24 * time.Hour
	}
	if c.IdempotencyBytes == 0 {
		c.IdempotencyBytes = 256 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Bus implements coordinator.Dispatcher over NATS JetStream.
type Bus struct {
	cfg    Config
	nc     *nats.Conn
	js     jetstream.JetStream
	work   jetstream.Stream
	events jetstream.Stream
	// output stores the output chunks the events carry (SetOutput); nil: they are only in files.
	output *Output
	// keys is the bucket of idempotency keys (IdempotencyStore).
	keys jetstream.KeyValue
	// workKey is the key of the work stream's ingest subjects (proto.WorkIngest).
	workKey string

	// ensured holds when each work consumer was last made sure of (ensureWork).
	mu      sync.Mutex
	ensured map[string]time.Time
	// dispatchFailed is when the last Dispatch failed, with dispatchErr, zero once one succeeded
	// since: Ready reports it for a while (dispatchFailReported).
	dispatchFailed time.Time
	dispatchErr    error
	// pools are the pools runners and dispatches named, for the bound per runner and the removal of
	// idle pools' consumers.
	pools *pools
}

// dispatchFailReported is how long Ready reports a failed Dispatch that no success followed. A
// stream can refuse writes while it answers every question about itself (its storage failing:
// "too many open files"); only a publish tells. It is not reported forever, so that one failure
// with no traffic after it does not keep a coordinator unready.
const dispatchFailReported = 30 * time.Second

// noteDispatch records the outcome of a Dispatch for Ready. A caller that went away says nothing of
// the stream.
func (b *Bus) noteDispatch(err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		b.dispatchFailed, b.dispatchErr = time.Time{}, nil
		return
	}
	b.dispatchFailed, b.dispatchErr = time.Now(), err
}

var _ coordinator.Dispatcher = (*Bus)(nil)

// New creates or updates the streams and returns a Bus.
func New(ctx context.Context, nc *nats.Conn, cfg Config) (*Bus, error) {
	cfg.setDefaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	for _, name := range []string{proto.WorkStream, proto.EventStream} {
		if err := checkReplicas(ctx, js, name, cfg.Replicas, streamsRemedy); err != nil {
			return nil, err
		}
	}
	key, err := workKey(ctx, js)
	if err != nil {
		return nil, err
	}
	work, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:     proto.WorkStream,
		Subjects: []string{proto.WorkIngestSubjects(key)},
		SubjectTransform: &jetstream.SubjectTransformConfig{
			Source:      proto.WorkIngestSubjects(key),
			Destination: proto.WorkSubjects,
		},
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    jetstream.FileStorage,
		Replicas:   cfg.Replicas,
		MaxMsgs:    cfg.WorkMessages,
		MaxMsgSize: proto.MaxMessageBytes,
		Discard:    jetstream.DiscardNew,
		Duplicates: 2 * time.Minute,
	})
	if err != nil {
		return nil, replicasError(proto.WorkStream, cfg.Replicas, err)
	}
	events, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       proto.EventStream,
		Subjects:   []string{proto.EventSubjects},
		Retention:  jetstream.WorkQueuePolicy,
		Storage:    jetstream.FileStorage,
		Replicas:   cfg.Replicas,
		MaxBytes:   cfg.EventBytes,
		MaxAge:     cfg.EventMaxAge,
		MaxMsgSize: proto.MaxMessageBytes,
		Discard:    jetstream.DiscardNew,
		Duplicates: 2 * time.Minute,
	})
	if err != nil {
		return nil, replicasError(proto.EventStream, cfg.Replicas, err)
	}
	keys, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:   IdempotencyBucket,
		History:  1,
		TTL:      IdempotencyTTL,
		Storage:  jetstream.FileStorage,
		Replicas: cfg.Replicas,
		MaxBytes: cfg.IdempotencyBytes,
	})
	if err != nil {
		return nil, fmt.Errorf("create bucket %s: %w", IdempotencyBucket, err)
	}
	return &Bus{
		cfg: cfg, nc: nc, js: js, work: work, events: events, keys: keys, workKey: key, ensured: map[string]time.Time{},
		pools: newPools(cfg.MaxPoolsPerRunner, cfg.WorkConsumerIdle, time.Now()),
	}, nil
}

// streamsRemedy is checkReplicas's advice for the work and event streams.
var streamsRemedy = fmt.Sprintf(", or delete the streams %s and %s (their queued work and unread events are lost) and start again", proto.WorkStream, proto.EventStream)

// checkReplicas refuses an existing stream whose replica count is not replicas. JetStream can change
// it in place, but a stream of 1 replica grown to 3 that way (nats-server 2.15.2) elected no new
// leader when its first one was lost, and stayed unusable: a fleet that believes it survives the
// loss of a server must not get that. The operator chooses instead (docs/fleet.md, "Replicas"); the
// error ends with remedy, what else than the stream's count to start with.
func checkReplicas(ctx context.Context, js jetstream.JetStream, name string, replicas int, remedy string) error {
	s, err := js.Stream(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("stream %s: %w", name, err)
	}
	if have := s.CachedInfo().Config.Replicas; have != replicas {
		return fmt.Errorf("stream %s has %d replicas, not %d: sbx does not change an existing stream's replicas; start with %d%s", name, have, replicas, have, remedy)
	}
	return nil
}

// JetStream's codes for a replica count the servers cannot hold (nats-server's errors.json).
const (
	// errCodeInsufficientResources (a 503): too few JetStream servers (or too little room) for the
	// stream's replicas. On a cluster whose servers still come up one by one it passes, so it stays
	// NotReady; the message says what is awaited.
	errCodeInsufficientResources jetstream.ErrorCode = 10023
	// errCodeReplicasNotSupported (a 500): replicas above 1 on a server that is not clustered. It
	// never passes.
	errCodeReplicasNotSupported jetstream.ErrorCode = 10074
	// errCodeNoPlacement (a 400): the cluster has fewer JetStream servers than replicas.
	errCodeNoPlacement jetstream.ErrorCode = 10005
)

// replicasError wraps err, the failure to create or update stream with replicas, with what it
// means when it comes from the replica count; the error stays the API error it was (NotReady).
func replicasError(stream string, replicas int, err error) error {
	var apiErr *jetstream.APIError
	switch {
	case replicas > 1 && errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeReplicasNotSupported:
		return fmt.Errorf("create stream %s with %d replicas: NATS is a single server, not a cluster: run a NATS cluster of at least %d JetStream servers, or 1 replica: %w", stream, replicas, replicas, err)
	case replicas > 1 && errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeNoPlacement:
		return fmt.Errorf("create stream %s with %d replicas: the NATS cluster has fewer than %d JetStream servers: %w", stream, replicas, replicas, err)
	case replicas > 1 && errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeInsufficientResources:
		return fmt.Errorf("create stream %s with %d replicas: fewer than %d JetStream servers of the cluster are up (or they lack room): %w", stream, replicas, replicas, err)
	}
	return fmt.Errorf("create stream %s: %w", stream, err)
}

// workKey returns the key of the work stream's ingest subjects (proto.WorkIngest): the one its
// configuration holds, or a new random one for a stream to be made, or made over from the time it
// took in its work subjects themselves. Coordinators started together on a new stream may each
// make one, and the last to configure the stream wins: start the first coordinator alone.
func workKey(ctx context.Context, js jetstream.JetStream) (string, error) {
	return ingestKey(ctx, js, proto.WorkStream, proto.WorkKeyOf)
}

// ingestKey returns the key that keyOf finds in the subjects of stream, or a new random one.
func ingestKey(ctx context.Context, js jetstream.JetStream, stream string, keyOf func(string) (string, bool)) (string, error) {
	s, err := js.Stream(ctx, stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return "", fmt.Errorf("stream %s: %w", stream, err)
	default:
		for _, subjects := range s.CachedInfo().Config.Subjects {
			if key, ok := keyOf(subjects); ok {
				return key, nil
			}
		}
	}
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("%s key: %w", stream, err)
	}
	return hex.EncodeToString(b[:]), nil
}

// Ready reports whether jobs can be submitted: the NATS connection is up, JetStream answers and is
// enabled for the account (a server whose storage failed, for instance on "too many open files",
// disables it while the connection stays up), both streams answer, the work stream has room, and
// the last job submission did not fail (recently, with no success since).
func (b *Bus) Ready(ctx context.Context) error {
	if !b.nc.IsConnected() {
		return coordinator.Errorf(coordinator.EUNAVAILABLE, "NATS is not connected (%s)", b.nc.Status())
	}
	if _, err := b.js.AccountInfo(ctx); err != nil {
		return coordinator.Errorf(coordinator.EUNAVAILABLE, "JetStream is not usable: %v", err)
	}
	work, err := b.work.Info(ctx)
	if err != nil {
		return coordinator.Errorf(coordinator.EUNAVAILABLE, "the work stream %s does not answer: %v", proto.WorkStream, err)
	}
	if max := work.Config.MaxMsgs; max > 0 && int64(work.State.Msgs) >= max {
		return coordinator.Errorf(coordinator.EUNAVAILABLE, "the work stream %s is full (%d queued jobs): no job can be submitted", proto.WorkStream, work.State.Msgs)
	}
	if _, err := b.events.Info(ctx); err != nil {
		return coordinator.Errorf(coordinator.EUNAVAILABLE, "the event stream %s does not answer: %v", proto.EventStream, err)
	}
	b.mu.Lock()
	failed, ferr := b.dispatchFailed, b.dispatchErr
	b.mu.Unlock()
	if !failed.IsZero() && time.Since(failed) < dispatchFailReported {
		return coordinator.Errorf(coordinator.EUNAVAILABLE, "the last job submission failed %s ago, and none succeeded since: %v", time.Since(failed).Round(time.Second), ferr)
	}
	return nil
}

// Dispatch queues work on its pool's subject, de-duplicated by job id. It stamps the message's NotAfter
// with the moment it stops waiting for the stream's confirmation.
//
// A start it refuses must never run. A publish that fails before it is sent (the connection is down:
// the coordinator's connection has no reconnect buffer, so that nothing is sent later) stored
// nothing. A publish whose outcome is unknown (no ack in time) is settled: the same message is
// published again, which the stream's de-duplication answers with the first copy's sequence, and that
// sequence is withdrawn. Withdrawn: the start is refused; already taken by a runner: the job runs and
// Dispatch succeeds. When even that fails, the work's NotAfter keeps it from starting unconfirmed.
func (b *Bus) Dispatch(ctx context.Context, work *coordinator.Work) (seq uint64, err error) {
	w := wireWork(work)
	defer func() { b.noteDispatch(err) }()
	capability := proto.CapPlain
	if w.Readonly {
		capability = proto.CapReadonly
	}
	b.pools.dispatched(w.Pool, time.Now())
	if err := b.ensureConsumer(ctx, w.Pool, capability); err != nil {
		return 0, err
	}
	w.NotAfter = time.Now().Add(b.cfg.PublishTimeout).UnixMilli()
	msg := &nats.Msg{Subject: proto.WorkIngest(b.workKey, w.Pool, capability), Data: proto.Encode(w), Header: nats.Header{}}
	msg.Header.Set(proto.HeaderVersion, fmt.Sprint(proto.Version))
	pctx, cancel := context.WithTimeout(ctx, b.cfg.PublishTimeout)
	ack, err := b.js.PublishMsg(pctx, msg, jetstream.WithMsgID(w.JobID))
	cancel()
	if err == nil {
		return ack.Sequence, nil
	}
	if notSent(err) {
		return 0, fmt.Errorf("queue job %s: %w", w.JobID, err)
	}
	seq, serr := b.settle(context.WithoutCancel(ctx), msg, w.JobID)
	if serr != nil {
		b.cfg.Logger.Warn("unsettled start: the runner that takes it asks first", "job", w.JobID, "err", serr)
		return 0, fmt.Errorf("queue job %s: %w", w.JobID, err)
	}
	if seq != 0 {
		b.cfg.Logger.Info("start settled as taken", "job", w.JobID, "publish_err", err)
		return seq, nil
	}
	b.cfg.Logger.Warn("start refused: its work was withdrawn, the stream's ack having come too late", "job", w.JobID, "publish_err", err)
	return 0, fmt.Errorf("queue job %s (withdrawn): %w", w.JobID, err)
}

// notSent reports whether a publish error means the message never reached a stream.
func notSent(err error) bool {
	return errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrMaxPayload)
}

// settle finds out what became of a publish whose ack never came, and withdraws the work if it is
// still queued. It returns the work's sequence when a runner took it, 0 when it was withdrawn.
func (b *Bus) settle(ctx context.Context, msg *nats.Msg, id string) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.PublishTimeout)
	defer cancel()
	ack, err := b.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id))
	if err != nil {
		return 0, err
	}
	withdrawn, err := b.Withdraw(ctx, ack.Sequence)
	if err != nil {
		return 0, err
	}
	if withdrawn {
		return 0, nil
	}
	return ack.Sequence, nil
}

// ensureRefresh is how long a work consumer made sure of is taken to still exist.
const ensureRefresh = time.Minute

// ensureWork makes sure of the work consumers of a pool: plain, and readonly when its runner can run
// readonly work. Failures are logged: the next heartbeat tries again.
func (b *Bus) ensureWork(ctx context.Context, pool string, readonly bool) {
	caps := []string{proto.CapPlain}
	if readonly {
		caps = append(caps, proto.CapReadonly)
	}
	for _, c := range caps {
		if err := b.ensureConsumer(ctx, pool, c); err != nil {
			b.cfg.Logger.Warn("work consumer", "pool", pool, "capability", c, "err", err)
		}
	}
}

// ensureConsumer creates (or updates) the durable pull consumer shared by the runners of a pool for a
// capability, unless it was made sure of within ensureRefresh. The coordinator creates the work
// consumers so that runners need no right to create, change or delete any: a runner only binds.
func (b *Bus) ensureConsumer(ctx context.Context, pool, capability string) error {
	name := proto.WorkConsumer(pool, capability)
	b.mu.Lock()
	last, known := b.ensured[name]
	full := !known && len(b.ensured) >= b.cfg.MaxWorkConsumers
	b.mu.Unlock()
	if time.Since(last) < ensureRefresh {
		return nil
	}
	if full {
		return fmt.Errorf("work consumer %s: the coordinator already made %d, the most it makes", name, b.cfg.MaxWorkConsumers)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := b.js.CreateOrUpdateConsumer(ctx, proto.WorkStream, workConsumerConfig(pool, capability))
	if err != nil {
		return fmt.Errorf("create work consumer %s: %w", name, err)
	}
	b.mu.Lock()
	b.ensured[name] = time.Now()
	b.mu.Unlock()
	return nil
}

// workConsumerConfig is the configuration of the work consumer of a pool and capability. A message
// not acked within AckWait goes to another pull; a runner acks before it starts the job.
func workConsumerConfig(pool, capability string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       proto.WorkConsumer(pool, capability),
		FilterSubject: proto.WorkSubject(pool, capability),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxDeliver:    -1,
	}
}

// Withdraw deletes queued work. It reports false when a runner already took it.
func (b *Bus) Withdraw(ctx context.Context, seq uint64) (bool, error) {
	if seq == 0 {
		return false, nil
	}
	err := b.work.DeleteMsg(ctx, seq)
	// A message a runner acked a moment ago is gone from the work-queue stream: the server answers
	// either "not found" or an unsuccessful delete, and both mean a runner has it.
	if errors.Is(err, jetstream.ErrMsgNotFound) || errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("withdraw work %d: %w", seq, err)
	}
	return true, nil
}

// CheckLink makes a round trip to NATS: the coordinator counts runners' silence only while it
// succeeds.
func (b *Bus) CheckLink(ctx context.Context) error {
	return b.nc.FlushWithContext(ctx)
}

// Control sends a request to a runner and decodes its reply.
func (b *Bus) Control(ctx context.Context, runner string, c *coordinator.Control) (*coordinator.ControlReply, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.ControlTimeout)
	defer cancel()
	msg, err := b.nc.RequestWithContext(ctx, proto.ControlSubject(runner), proto.Encode(wireControl(c)))
	if err != nil {
		return nil, fmt.Errorf("control %s: %w", runner, err)
	}
	reply, err := proto.DecodeControlReply(msg.Data)
	if err != nil {
		return nil, err
	}
	return domainControlReply(reply), nil
}
