package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sbx-dev/sbx/coordinator/natsauth"
)

// serveAuthDir is where `sbx serve` keeps its NATS authority, under its data dir.
const serveAuthDir = "nats-auth"

// natsFlags are the NATS client flags the coordinator and the runner share. Credentials come from a
// file only: never on the command line or in an environment that jobs inherit.
type natsFlags struct {
	url, creds, ca, tlsCert, tlsKey string
}

func (n *natsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&n.url, "nats", "", "NATS URL (required)")
	fs.StringVar(&n.creds, "nats-creds", "", "NATS credentials file (mode 0600), from sbx auth init or sbx auth runner")
	fs.StringVar(&n.ca, "nats-ca", "", "PEM CA bundle the NATS server's certificate must chain to (TLS)")
	fs.StringVar(&n.tlsCert, "nats-tls-cert", "", "PEM client certificate for NATS (TLS); needs --nats-tls-key")
	fs.StringVar(&n.tlsKey, "nats-tls-key", "", "PEM private key of --nats-tls-cert")
}

// options checks the flags and returns the connection options they ask for. runnerID, when set,
// gives the connection the runner's own inbox prefix.
func (n *natsFlags) options(runnerID string) ([]nats.Option, error) {
	var opts []nats.Option
	if n.creds != "" {
		if _, err := natsauth.ReadSecret(n.creds); err != nil {
			return nil, fmt.Errorf("--nats-creds: %w", err)
		}
		opts = append(opts, nats.UserCredentials(n.creds))
	}
	if runnerID != "" {
		opts = append(opts, nats.CustomInboxPrefix(natsauth.RunnerInboxPrefix(runnerID)))
	}
	if n.ca != "" {
		opts = append(opts, nats.RootCAs(n.ca))
	}
	if (n.tlsCert == "") != (n.tlsKey == "") {
		return nil, usageError("--nats-tls-cert and --nats-tls-key go together")
	}
	if n.tlsCert != "" {
		opts = append(opts, nats.ClientCert(n.tlsCert, n.tlsKey))
	}
	return opts, nil
}

// checkCredsPool checks that --nats-creds, when limited to a pool, are for pool: a runner of
// another pool would be refused its heartbeats and its pulls.
func (n *natsFlags) checkCredsPool(pool string) error {
	if n.creds == "" {
		return nil
	}
	b, err := natsauth.ReadSecret(n.creds)
	if err != nil {
		return fmt.Errorf("--nats-creds: %w", err)
	}
	credsPool, err := natsauth.PoolOf(b)
	if err != nil {
		return fmt.Errorf("--nats-creds: %w", err)
	}
	if credsPool != "" && credsPool != pool {
		return usageError("--pool %s but --nats-creds are for pool %s", pool, credsPool)
	}
	return nil
}

// runnerIDFromCreds returns the runner id --nats-creds was minted for, checking it against --id:
// a runner connecting with another runner's creds would be refused every publish.
func (n *natsFlags) runnerIDFromCreds(id string) (string, error) {
	if n.creds == "" {
		return id, nil
	}
	b, err := natsauth.ReadSecret(n.creds)
	if err != nil {
		return "", fmt.Errorf("--nats-creds: %w", err)
	}
	credsID, err := natsauth.RunnerOf(b)
	if err != nil {
		return "", fmt.Errorf("--nats-creds: %w", err)
	}
	switch {
	case credsID == "":
		return id, nil // not a runner's creds (a shared user of the operator's own): its business
	case id == "":
		return credsID, nil
	case id != credsID:
		return "", usageError("--id %s but --nats-creds is runner %s's", id, credsID)
	}
	return id, nil
}

// credsOption returns the option that connects as the user of creds held in memory: serve's
// in-process connections, an enrolled runner.
func credsOption(creds []byte) (nats.Option, error) {
	token, seed, err := natsauth.Split(creds)
	if err != nil {
		return nil, err
	}
	return nats.UserJWTAndSeed(token, string(seed)), nil
}

// drainTimeout bounds how long drain waits for a connection to deliver what it holds: a stop must
// not wait on a NATS server that does not answer.
const drainTimeout = 5 * time.Second

// connect dials NATS with sbx's settings: reconnect forever, notice a dead link within seconds, and
// make a full reconnect buffer an error the publisher sees. opts come last and override them.
func connect(log *slog.Logger, name, url string, opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{
		nats.Name(name),
		nats.DrainTimeout(drainTimeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.PingInterval(2 * time.Second),
		nats.MaxPingsOutstanding(3),
		nats.ReconnectBufSize(16 << 20),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("nats disconnected", "conn", name, "err", err) }),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "conn", name, "url", c.ConnectedUrlRedacted()) }),
		nats.ClosedHandler(func(*nats.Conn) { log.Info("nats connection closed", "conn", name) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { log.Warn("nats", "conn", name, "err", err) }),
	}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", url, err)
	}
	return nc, nil
}

// drain closes nc once its subscriptions have handled what they hold and what it published has
// reached the server, within drainTimeout: a stopping runner's last control replies, a coordinator's
// output chunks whose acks it has not waited for. A connection that is not connected has nothing to
// deliver: Drain closes it at once.
func drain(nc *nats.Conn) {
	closed := make(chan struct{})
	logClosed := nc.Opts.ClosedCB
	nc.SetClosedHandler(func(c *nats.Conn) {
		if logClosed != nil {
			logClosed(c)
		}
		close(closed)
	})
	if err := nc.Drain(); err != nil {
		nc.Close()
		return
	}
	select {
	case <-closed:
	case <-time.After(2 * drainTimeout):
		nc.Close()
	}
}

// dialRetry is the pause between two attempts to reach NATS at start-up; dialNotice the one between
// two log lines saying so.
const (
	dialRetry  = time.Second
	dialNotice = 5 * time.Second
)

// dial connects as connect does, waiting for NATS when it is not up yet (a fleet's parts start in any
// order): it tries again every dialRetry and says so every dialNotice. A refusal that waiting cannot
// cure (bad credentials, TLS) is returned at once. When ctx ends first it returns a nil connection
// and no error: the process was stopped before it started.
func dial(ctx context.Context, log *slog.Logger, name, url string, opts ...nats.Option) (*nats.Conn, error) {
	var said time.Time
	for {
		nc, err := connect(log, name, url, opts...)
		if err == nil {
			if !said.IsZero() {
				log.Info("nats is up", "conn", name, "url", nc.ConnectedUrlRedacted())
			}
			return nc, nil
		}
		var netErr net.Error
		if !errors.Is(err, nats.ErrNoServers) && !errors.Is(err, nats.ErrTimeout) && !errors.As(err, &netErr) {
			return nil, err
		}
		if time.Since(said) >= dialNotice {
			log.Warn("waiting for NATS", "conn", name, "url", url, "err", err)
			said = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(dialRetry):
		}
	}
}

// coordinatorConn is the option of the coordinator's connection: no reconnect buffer. A publish
// while NATS is unreachable fails at once, so that a start the API refuses (503) is not sent later
// by the buffer and run behind the caller's back.
func coordinatorConn() nats.Option { return nats.ReconnectBufSize(-1) }
