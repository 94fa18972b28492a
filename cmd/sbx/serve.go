package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/sbx-dev/sbx/coordinator/natsauth"
	"github.com/sbx-dev/sbx/runner"
)

// serveLeaseTTL is serve's lease: its embedded NATS has no other coordinator to hand over to, and a
// machine too loaded to renew within the default TTL's step-down (seen under emulation, with a job
// writing 100 MB) would stop and restart its service for nothing, cutting the streams open. A
// restarted serve takes its own lease back at once whatever the TTL.
const serveLeaseTTL = time.Minute

// defaultUser is the user sbx serve runs jobs as when --user is not given: the user who ran sudo,
// so that a root runner started with "sudo make run" does not run every job as root.
func defaultUser(getenv func(string) string) string {
	if os.Geteuid() != 0 {
		return ""
	}
	if u := getenv("SUDO_USER"); u != "" && u != "root" {
		return u
	}
	return ""
}

// serveFlags are serve's flags: the coordinator's, the runner's and its embedded NATS server's.
type serveFlags struct {
	cf                coordinatorFlags
	rf                runnerFlags
	natsCert, natsKey string
	natsHost          string // --nats-listen, parsed
	natsPort          int
}

// cmdServe runs the coordinator, an embedded NATS server and a runner in one process.
func cmdServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("serve", stderr)
	sf, err := parseServe(fs, args, getenv)
	if err != nil {
		return err
	}
	log := newLogger(stderr)
	api, err := openAPI(sf.cf, log)
	if err != nil {
		return err
	}
	defer api.ln.Close()
	// The data dir holds every secret of serve (the authority, the store), and the flags name more
	// (token, TLS keys): jobs must not see them.
	secrets, err := secretPaths(fs)
	if err != nil {
		return err
	}
	if err := checkSecrets(secrets); err != nil {
		return err
	}
	// The embedded server runs in operator mode: it refuses anonymous clients, and the coordinator
	// and the runner connect as users held to their own subjects.
	auth, err := natsauth.Open(filepath.Join(sf.cf.data, serveAuthDir))
	if err != nil {
		return err
	}
	ns, err := startEmbeddedNATS(sf, auth)
	if err != nil {
		return err
	}
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	coordConn, runnerConn, beatsConn, err := serveConns(log, ns, auth, sf.rf)
	if err != nil {
		return err
	}
	defer drain(coordConn)
	defer drain(runnerConn) // before the coordinator's, and both before the server shuts down
	defer drain(beatsConn)
	return runServe(ctx, sf, api, ns, coordConn, runnerConn, beatsConn, secrets, log, stdout)
}

// parseServe parses serve's flags into fs and checks them, so that a mistake stops serve before
// anything starts.
func parseServe(fs *flag.FlagSet, args []string, getenv func(string) string) (*serveFlags, error) {
	sf := &serveFlags{}
	sf.cf.register(fs, getenv)
	sf.rf.register(fs)
	natsListen := fs.String("nats-listen", "127.0.0.1:4222", "address of the embedded NATS server, for more runners (each with creds from 'sbx auth runner --data DIR --id R')")
	fs.StringVar(&sf.natsCert, "nats-tls-cert", "", "PEM certificate for the embedded NATS server to serve TLS with; needs --nats-tls-key")
	fs.StringVar(&sf.natsKey, "nats-tls-key", "", "PEM private key of --nats-tls-cert")
	if err := parse(fs, args); err != nil {
		return nil, err
	}
	if sf.rf.user == "" {
		sf.rf.user = defaultUser(getenv)
	}
	sf.rf.deadline = sf.cf.runnerDeadline
	if err := sf.rf.check(); err != nil {
		return nil, err
	}
	if (sf.natsCert == "") != (sf.natsKey == "") {
		return nil, usageError("--nats-tls-cert and --nats-tls-key go together")
	}
	if sf.cf.replicas != 1 {
		return nil, usageError("serve --replicas must be 1: its embedded NATS is a single server; run 'sbx coordinator --replicas N' on a NATS cluster")
	}
	sf.cf.leaseTTL = serveLeaseTTL
	var err error
	if sf.natsHost, sf.natsPort, err = splitHostPort(*natsListen); err != nil {
		return nil, usageError("--nats-listen: %v", err)
	}
	if sf.rf.id == "" {
		if sf.rf.id, err = runner.DefaultID(); err != nil {
			return nil, err
		}
	}
	return sf, nil
}

// startEmbeddedNATS starts serve's NATS server, with JetStream in the data dir and auth's accounts,
// and waits until it takes connections. The caller shuts it down.
func startEmbeddedNATS(sf *serveFlags, auth *natsauth.Authority) (*server.Server, error) {
	opts := &server.Options{
		ServerName: "sbx", Host: sf.natsHost, Port: sf.natsPort, JetStream: true, NoSigs: true,
		StoreDir: filepath.Join(sf.cf.data, "nats"), MaxPayload: 2 << 20,
	}
	if err := auth.Configure(opts); err != nil {
		return nil, err
	}
	if sf.natsCert != "" {
		var err error
		if opts.TLSConfig, err = server.GenTLSConfig(&server.TLSConfigOpts{CertFile: sf.natsCert, KeyFile: sf.natsKey}); err != nil {
			return nil, fmt.Errorf("--nats-tls-cert/--nats-tls-key: %w", err)
		}
		opts.TLS = true
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		ns.WaitForShutdown()
		return nil, errors.New("embedded nats did not start")
	}
	return ns, nil
}

// serveConns connects the coordinator and the runner (twice: its heartbeats have a connection of
// their own) to the embedded server in-process, each as its own user of auth.
func serveConns(log *slog.Logger, ns *server.Server, auth *natsauth.Authority, rf runnerFlags) (coordConn, runnerConn, beatsConn *nats.Conn, err error) {
	coordCreds, err := auth.CoordinatorCreds()
	if err != nil {
		return nil, nil, nil, err
	}
	runnerCreds, err := auth.RunnerCreds(rf.id, rf.pool, 0)
	if err != nil {
		return nil, nil, nil, usageError("--id: %v", err)
	}
	coordUser, err := credsOption(coordCreds)
	if err != nil {
		return nil, nil, nil, err
	}
	runnerUser, err := credsOption(runnerCreds)
	if err != nil {
		return nil, nil, nil, err
	}
	coordConn, err = connect(log, "sbx-coordinator", "", nats.InProcessServer(ns), coordUser, coordinatorConn())
	if err != nil {
		return nil, nil, nil, err
	}
	runnerOpts := []nats.Option{nats.InProcessServer(ns), runnerUser, nats.CustomInboxPrefix(natsauth.RunnerInboxPrefix(rf.id))}
	if runnerConn, err = connect(log, "sbx-runner", "", runnerOpts...); err == nil {
		if beatsConn, err = connect(log, "sbx-runner-heartbeats", "", runnerOpts...); err != nil {
			runnerConn.Close()
		}
	}
	if err != nil {
		// serve stops before it started: nothing was published on these connections.
		coordConn.Close()
		return nil, nil, nil, err
	}
	return coordConn, runnerConn, beatsConn, nil
}

// runServe runs serve's three parts until ctx ends or one of them stops.
func runServe(ctx context.Context, sf *serveFlags, api *apiListener, ns *server.Server, coordConn, runnerConn, beatsConn *nats.Conn, secrets []string, log *slog.Logger, stdout io.Writer) error {
	// The embedded server has no channel for its end; this goroutine ends with the deferred Shutdown.
	nsDone := make(chan struct{})
	go func() { ns.WaitForShutdown(); close(nsDone) }()

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return supervise(gctx, "coordinator", func(ctx context.Context) error {
			return serveCoordinator(ctx, coordConn, sf.cf, api, true, log, func() {
				fmt.Fprintf(stdout, "sbx %s: API %s, NATS nats://%s, data %s\n", version, api.url, ns.Addr(), sf.cf.data)
			})
		})
	})
	g.Go(func() error {
		return supervise(gctx, "runner", func(ctx context.Context) error { return serveRunner(ctx, runnerConn, beatsConn, sf.rf, secrets, log) })
	})
	g.Go(func() error {
		return supervise(gctx, "embedded nats", func(ctx context.Context) error {
			select {
			case <-ctx.Done():
			case <-nsDone:
			}
			return nil
		})
	})
	return g.Wait()
}
