package natsbus

import (
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/sbx-dev/sbx/proto"
)

// queueGroup is the queue group of the coordinators' forwarders: each pull is forwarded once, by one
// of them, or JetStream would deliver a runner a message per coordinator.
const queueGroup = "sbx-coordinator"

// maxPullRequest bounds the body of a forwarded pull request (JetStream's JSON of batch, expiry,
// heartbeat).
const maxPullRequest = 1024

// inInbox reports whether reply is in runner's inbox (proto.RunnerInbox), the one place only that
// runner reads.
func inInbox(reply, runner string) bool {
	return runner != "" && strings.HasPrefix(reply, proto.RunnerInbox(runner)+".")
}

// forwardPull forwards a runner's request on sbx.v1.pull.<runner>.<api> to $JS.API.<api>, when <api>
// is a consumer info or a pull of a work consumer and the reply is in the runner's inbox. So work,
// which carries commands, environment and claims, is delivered into the inbox of the runner that
// asked and nowhere else: NATS permissions bound a publish's subject, never its reply, and a runner
// that could pull from JetStream directly could have its work delivered to any subject, a stream's
// included. Which pools a runner may pull from its creds decide (the server refuses a pull subject
// its permissions do not allow); the coordinator adds the reply's check.
func (b *Bus) forwardPull(m *nats.Msg) {
	rest, _ := strings.CutPrefix(m.Subject, "sbx.v1.pull.")
	runner, api, _ := strings.Cut(rest, ".")
	consumer, ok := strings.CutPrefix(api, "CONSUMER.MSG.NEXT."+proto.WorkStream+".")
	if !ok {
		consumer, ok = strings.CutPrefix(api, "CONSUMER.INFO."+proto.WorkStream+".")
	}
	_, _, isWork := proto.ParseWorkConsumer(consumer)
	switch {
	case !ok || !isWork || !proto.ValidToken(runner):
		b.cfg.Logger.Error("dropping a pull for no work consumer", "subject", m.Subject)
		return
	case !inInbox(m.Reply, runner):
		b.cfg.Logger.Error("dropping a pull whose reply is not its runner's inbox", "subject", m.Subject, "reply", m.Reply)
		return
	case len(m.Data) > maxPullRequest:
		b.cfg.Logger.Error("dropping an oversized pull", "subject", m.Subject, "bytes", len(m.Data))
		return
	}
	if err := b.nc.PublishMsg(&nats.Msg{Subject: "$JS.API." + api, Reply: m.Reply, Data: m.Data}); err != nil {
		b.cfg.Logger.Warn("forward pull", "subject", m.Subject, "err", err)
	}
}
