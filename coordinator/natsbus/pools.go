package natsbus

import (
	"context"
	"sync"
	"time"

	"github.com/sbx-dev/sbx/proto"
)

// pools remembers which pools each runner named in its heartbeats, and when any runner or dispatch
// last named each pool: a runner names at most max pools within idle, and the work consumers of a
// pool nobody named for idle are removed (sweepWork). Heartbeats are what make the coordinator
// create work consumers, and runner creds without a pool may name any: so the bound is per runner.
type pools struct {
	max  int
	idle time.Duration
	// start stands for "named" for every pool this coordinator has not heard of: a consumer made by
	// an earlier life gets a full idle period before it is removed.
	start time.Time

	mu       sync.Mutex
	byRunner map[string]map[string]time.Time // runner → pool → last named
	named    map[string]time.Time            // pool → last named by a runner or a dispatch
}

func newPools(max int, idle time.Duration, now time.Time) *pools {
	return &pools{max: max, idle: idle, start: now, byRunner: map[string]map[string]time.Time{}, named: map[string]time.Time{}}
}

// name records that runner named pool at now, unless that would make it a runner of more than max
// pools named within idle: then it reports false and records nothing.
func (p *pools) name(runner, pool string, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	mine := p.byRunner[runner]
	if mine == nil {
		mine = map[string]time.Time{}
		p.byRunner[runner] = mine
	}
	for q, at := range mine {
		if now.Sub(at) > p.idle {
			delete(mine, q)
		}
	}
	if _, known := mine[pool]; !known && len(mine) >= p.max {
		return false
	}
	mine[pool] = now
	p.named[pool] = now
	return true
}

// dispatched records that work was queued for pool at now: its consumer stays while the work may
// wait for a runner.
func (p *pools) dispatched(pool string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.named[pool] = now
}

// idleAt reports whether nobody named pool within idle before now; it forgets runners that named
// nothing within idle.
func (p *pools) idleAt(pool string, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for r, mine := range p.byRunner {
		for q, at := range mine {
			if now.Sub(at) > p.idle {
				delete(mine, q)
			}
		}
		if len(mine) == 0 {
			delete(p.byRunner, r)
		}
	}
	at, ok := p.named[pool]
	if !ok {
		at = p.start
	}
	if now.Sub(at) <= p.idle {
		return false
	}
	delete(p.named, pool)
	return true
}

// sweepWork removes, every WorkConsumerIdle/4 until ctx ends, the work consumers of pools nobody
// named within WorkConsumerIdle. Queued work stays in the stream: the consumer is made again when a
// runner of its pool heartbeats or work is dispatched to it.
func (b *Bus) sweepWork(ctx context.Context) {
	t := time.NewTicker(b.cfg.WorkConsumerIdle / 4)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		if err := b.removeIdleWork(ctx, time.Now()); err != nil {
			b.cfg.Logger.Warn("remove idle work consumers", "err", err)
		}
	}
}

// removeIdleWork removes the work consumers of the pools idle at now.
func (b *Bus) removeIdleWork(ctx context.Context, now time.Time) error {
	names := b.work.ConsumerNames(ctx)
	var idle []string
	for name := range names.Name() {
		pool, _, ok := proto.ParseWorkConsumer(name)
		if ok && b.pools.idleAt(pool, now) {
			idle = append(idle, name)
		}
	}
	if err := names.Err(); err != nil {
		return err
	}
	for _, name := range idle {
		if err := b.js.DeleteConsumer(ctx, proto.WorkStream, name); err != nil {
			return err
		}
		b.mu.Lock()
		delete(b.ensured, name)
		b.mu.Unlock()
		b.cfg.Logger.Info("removed the work consumer of an idle pool", "consumer", name)
	}
	return nil
}
