package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/httpapi"
	"github.com/sbx-dev/sbx/coordinator/natsbus"
	"github.com/sbx-dev/sbx/coordinator/store"
	"github.com/sbx-dev/sbx/runner"
	"github.com/sbx-dev/sbx/sandbox"
)

// newFlags returns a flag set that reports errors instead of exiting.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sbx "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parse parses flags, turning a mistake into a usage error.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &exitError{code: 0}
		}
		return &exitError{code: 2}
	}
	return nil
}

func defaultDataDir(getenv func(string) string) string {
	if os.Geteuid() == 0 {
		return "/var/lib/sbx"
	}
	if d := getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "sbx")
	}
	return filepath.Join(getenv("HOME"), ".local", "state", "sbx")
}

func newLogger(stderr io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// coordinatorFlags are the flags serve and coordinator share.
type coordinatorFlags struct {
	listen, data, tokenFile string
	stallAfter              time.Duration
	retainAge               time.Duration
	retainBytes             string
}

func (c *coordinatorFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	fs.StringVar(&c.listen, "listen", "127.0.0.1:7070", "HTTP API address")
	fs.StringVar(&c.data, "data", defaultDataDir(getenv), "data directory")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the bearer token every /v1 call must carry")
	fs.DurationVar(&c.stallAfter, "stall-after", 30*time.Second, "how long output must stay unchanged before a prompt-like last line notifies")
	fs.DurationVar(&c.retainAge, "retain-age", coordinator.DefaultRetainAge, "how long ended jobs (record and output) and notifications are kept")
	fs.StringVar(&c.retainBytes, "retain-bytes", "10G", "most output of ended jobs kept; past it the oldest jobs go first")
}

// runnerFlags are the flags serve and runner share.
type runnerFlags struct {
	id, pool, cgroupRoot, user, shell string
	users                             stringList
	slots                             int
}

func (r *runnerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.id, "id", "", "runner id (default: the host name)")
	fs.StringVar(&r.pool, "pool", "default", "pool whose work this runner takes")
	fs.IntVar(&r.slots, "slots", runner.DefaultSlots, "jobs run at once at most (a guard, not a CPU count: dev servers and watchers hold slots for hours)")
	fs.StringVar(&r.cgroupRoot, "cgroup-root", "sbx", "cgroup under which the runner makes its jobs' cgroups")
	fs.StringVar(&r.shell, "shell", "", "absolute path of the shell jobs run in by default (default: bash when installed, else /bin/sh)")
	fs.StringVar(&r.user, "user", "", "user jobs run as (default: the runner's own; serve started with sudo: $SUDO_USER)")
	fs.Var(&r.users, "allow-user", "another user a job may ask for with \"user\" (repeatable; needs --user)")
}

// stringList collects a repeated flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

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

func cmdServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("serve", stderr)
	var cf coordinatorFlags
	var rf runnerFlags
	cf.register(fs, getenv)
	rf.register(fs)
	natsListen := fs.String("nats-listen", "127.0.0.1:4222", "address of the embedded NATS server, for more runners")
	if err := parse(fs, args); err != nil {
		return err
	}
	if rf.user == "" {
		rf.user = defaultUser(getenv)
	}
	log := newLogger(stderr)
	host, port, err := splitHostPort(*natsListen)
	if err != nil {
		return usageError("--nats-listen: %v", err)
	}
	if err := os.MkdirAll(cf.data, 0o755); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	ns, err := server.NewServer(&server.Options{
		ServerName: "sbx", Host: host, Port: port, JetStream: true, NoSigs: true,
		StoreDir: filepath.Join(cf.data, "nats"), MaxPayload: 2 << 20,
	})
	if err != nil {
		return fmt.Errorf("embedded nats: %w", err)
	}
	ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(30 * time.Second) {
		return errors.New("embedded nats did not start")
	}
	coordConn, err := connect(log, "sbx-coordinator", "", nats.InProcessServer(ns))
	if err != nil {
		return err
	}
	defer coordConn.Close()
	runnerConn, err := connect(log, "sbx-runner", "", nats.InProcessServer(ns))
	if err != nil {
		return err
	}
	defer runnerConn.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	ready := make(chan string, 1)
	wg.Add(2)
	go func() {
		defer wg.Done()
		errs <- serveCoordinator(ctx, coordConn, cf, true, log, ready)
		cancel()
	}()
	go func() {
		defer wg.Done()
		errs <- serveRunner(ctx, runnerConn, rf, log)
		cancel()
	}()
	select {
	case addr := <-ready:
		fmt.Fprintf(stdout, "sbx %s: API http://%s, NATS nats://%s, data %s\n", version, addr, ns.Addr(), cf.data)
	case <-ctx.Done():
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

func cmdCoordinator(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("coordinator", stderr)
	var cf coordinatorFlags
	cf.register(fs, getenv)
	natsURL := fs.String("nats", "", "NATS URL (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *natsURL == "" {
		return usageError("coordinator: --nats URL is required")
	}
	log := newLogger(stderr)
	nc, err := connect(log, "sbx-coordinator", *natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	ready := make(chan string, 1)
	go func() {
		select {
		case addr := <-ready:
			fmt.Fprintf(stdout, "sbx %s: API http://%s, data %s\n", version, addr, cf.data)
		case <-ctx.Done():
		}
	}()
	return serveCoordinator(ctx, nc, cf, false, log, ready)
}

func cmdRunner(ctx context.Context, args []string, _ func(string) string, stderr io.Writer) error {
	fs := newFlags("runner", stderr)
	var rf runnerFlags
	rf.register(fs)
	natsURL := fs.String("nats", "", "NATS URL (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *natsURL == "" {
		return usageError("runner: --nats URL is required")
	}
	log := newLogger(stderr)
	nc, err := connect(log, "sbx-runner", *natsURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	return serveRunner(ctx, nc, rf, log)
}

// connect dials NATS with sbx's settings: reconnect forever, notice a dead link within seconds, and
// make a full reconnect buffer an error the publisher sees.
func connect(log *slog.Logger, name, url string, opts ...nats.Option) (*nats.Conn, error) {
	opts = append(opts,
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond),
		nats.PingInterval(2*time.Second),
		nats.MaxPingsOutstanding(3),
		nats.ReconnectBufSize(16<<20),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("nats disconnected", "conn", name, "err", err) }),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "conn", name, "url", c.ConnectedUrlRedacted()) }),
		nats.ClosedHandler(func(*nats.Conn) { log.Info("nats connection closed", "conn", name) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { log.Warn("nats", "conn", name, "err", err) }),
	)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", url, err)
	}
	return nc, nil
}

// serveCoordinator runs the coordinator until ctx ends. It sends the API's address on ready.
func serveCoordinator(ctx context.Context, nc *nats.Conn, cf coordinatorFlags, local bool, log *slog.Logger, ready chan<- string) error {
	token, err := readToken(cf.tokenFile)
	if err != nil {
		return err
	}
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
	bus, err := natsbus.New(ctx, nc, natsbus.Config{Logger: log})
	if err != nil {
		return err
	}
	retainBytes, err := parseBytes(cf.retainBytes)
	if err != nil || retainBytes <= 0 {
		return usageError("--retain-bytes %q must be a positive size like 10G", cf.retainBytes)
	}
	if cf.retainAge <= 0 {
		return usageError("--retain-age must be positive")
	}
	svc, err := coordinator.New(ctx, coordinator.Config{
		CheckCwd: local, Logger: log, StallAfter: cf.stallAfter, RetainAge: cf.retainAge, RetainBytes: retainBytes,
	}, db, terms, bus)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cf.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := httpapi.NewServer(svc, httpapi.Config{Token: token, Logger: log, Ready: bus.Ready, Version: version})
	srv.Open(ln)

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); svc.Run(ctx) }()
	consumeErr := make(chan error, 1)
	go func() { defer wg.Done(); consumeErr <- bus.Consume(ctx, svc) }()
	ready <- ln.Addr().String()

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-consumeErr:
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	closeErr := srv.Close(shutdown)
	wg.Wait()
	return errors.Join(runErr, closeErr)
}

// serveRunner runs a runner until ctx ends.
func serveRunner(ctx context.Context, nc *nats.Conn, rf runnerFlags, log *slog.Logger) error {
	r, err := runner.New(nc, runner.Config{
		ID: rf.id, Pool: rf.pool, Slots: rf.slots, Version: version, Logger: log, User: rf.user, Users: rf.users, Shell: rf.shell,
		Cgroup: sandbox.Config{Root: rf.cgroupRoot},
	})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// readToken reads the bearer token from a file; no file means no token.
func readToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return token, nil
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("port %q is not a number", p)
	}
	return host, port, nil
}
