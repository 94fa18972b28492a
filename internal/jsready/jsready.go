// Package jsready tells a JetStream error that means "not yet" from a refusal. The coordinator's
// natsbus and the runner both wait out the first and stop on the second; they share no other
// package than proto, which imports only the standard library, so the one definition lives here.
package jsready

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NotReady reports whether err, from a JetStream call, means JetStream cannot answer yet (not
// enabled yet, a cluster still electing its leader, a link being re-established) rather than a
// refusal: the caller may try again.
func NotReady(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrReconnectBufExceeded) ||
		errors.As(err, &apiErr) && apiErr.Code == 503
}
