package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/httpapi"
	"github.com/sbx-dev/sbx/coordinator/mcp"
	"github.com/sbx-dev/sbx/coordinator/natsauth"
	"github.com/sbx-dev/sbx/coordinator/natsbus"
	"github.com/sbx-dev/sbx/proto"
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
	tlsCert, tlsKey         string
	allowHosts              stringList
	insecureNoToken         bool
	stallAfter              time.Duration
	inputStallAfter         time.Duration
	runnerDeadline          time.Duration
	retainAge               time.Duration
	retainBytes             string
	mcpMaxBlock             time.Duration

	// maxConns and maxConnsPerClient bound the API's connections (httpapi.Config.MaxConns);
	// mcpSessions the sessions of /mcp; outputBudget and minFreeDisk the disk jobs' output uses.
	maxConns, maxConnsPerClient int
	mcpSessions                 mcp.SessionLimits
	outputBudget, minFreeDisk   string
	// replicas is the replica count of the streams (natsbus.Config.Replicas).
	replicas int
	// advertise is the URL other coordinators forward calls to when this one leads, and leaseTTL
	// the lease's (natsbus.LeaseConfig); sbx coordinator's flags, serve's defaults.
	advertise string
	leaseTTL  time.Duration
}

func (c *coordinatorFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	fs.StringVar(&c.listen, "listen", "127.0.0.1:7070", "HTTP API address")
	fs.StringVar(&c.data, "data", defaultDataDir(getenv), "data directory")
	fs.StringVar(&c.tokenFile, "token-file", "", "file (mode 0600) holding the bearer token every call but the probes must carry; required to listen beyond loopback")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "PEM certificate (chain) to serve the API over HTTPS with; needs --tls-key")
	fs.StringVar(&c.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.Var(&c.allowHosts, "allow-host", "a name clients reach the API by, accepted in the Host header besides localhost, 127.0.0.1 and [::1] (repeatable; '*' accepts any and needs --token-file)")
	fs.BoolVar(&c.insecureNoToken, "insecure-no-token", false, "listen beyond loopback without a token: only for a container whose port is published on the host's loopback alone")
	fs.DurationVar(&c.stallAfter, "stall-after", 30*time.Second, "how long output must stay unchanged before a prompt-like last line notifies")
	fs.DurationVar(&c.inputStallAfter, "input-stall-after", 10*time.Second, "how long a job's processes must all wait for input (as its runner sees them) before that notifies")
	fs.DurationVar(&c.runnerDeadline, "runner-deadline", proto.DefaultRunnerDeadline, "how long a runner may stay silent before its jobs are marked lost (give runners the same --runner-deadline)")
	fs.DurationVar(&c.retainAge, "retain-age", coordinator.DefaultRetainAge, "how long ended jobs (record and output) and notifications are kept")
	fs.StringVar(&c.retainBytes, "retain-bytes", "10G", "most output of ended jobs kept; past it the oldest jobs go first")
	fs.DurationVar(&c.mcpMaxBlock, "mcp-max-block", mcp.DefaultMaxBlock, "longest a tool call of /mcp blocks before it returns a continuation")
	fs.IntVar(&c.maxConns, "max-conns", httpapi.DefaultMaxConns, "most HTTP connections open at a time; more are closed on accept")
	fs.IntVar(&c.maxConnsPerClient, "max-conns-per-client", httpapi.DefaultMaxConnsPerClient, "most HTTP connections open at a time from one client IP")
	fs.IntVar(&c.mcpSessions.Max, "mcp-max-sessions", mcp.DefaultMaxSessions, "most /mcp sessions open at a time")
	fs.IntVar(&c.mcpSessions.PerToken, "mcp-max-sessions-per-token", mcp.DefaultMaxSessionsPerToken, "most /mcp sessions open at a time with one token")
	fs.DurationVar(&c.mcpSessions.Idle, "mcp-session-idle", mcp.DefaultSessionIdle, "how long a /mcp session may go without a request before it is closed")
	fs.StringVar(&c.outputBudget, "output-budget", "20G", "most output stored for all jobs together, ended and running (above --retain-bytes); past it new jobs are refused and a job writing more is stopped")
	fs.StringVar(&c.minFreeDisk, "min-free-disk", "1G", "free space the data directory's disk keeps; below it new jobs are refused (0: not checked)")
	fs.IntVar(&c.replicas, "replicas", 1, "replicas of each NATS stream sbx makes: above 1 needs a NATS cluster of at least that many JetStream servers, and keeps queued work when one is lost")
}

// serveLeaseTTL is serve's lease: its embedded NATS has no other coordinator to hand over to, and a
// machine too loaded to renew within the default TTL's step-down (seen under emulation, with a job
// writing 100 MB) would stop and restart its service for nothing, cutting the streams open. A
// restarted serve takes its own lease back at once whatever the TTL.
const serveLeaseTTL = time.Minute

// registerFleet registers the flags of a coordinator that shares its NATS with others.
func (c *coordinatorFlags) registerFleet(fs *flag.FlagSet) {
	fs.StringVar(&c.advertise, "advertise", "", "URL the other coordinators forward calls to while this one leads (default: http(s)://LISTEN, with the host's name when LISTEN is 0.0.0.0 or [::])")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", natsbus.DefaultLeaseTTL, "how long a leading coordinator may go unheard before another takes over (give every coordinator the same)")
}

// api is the HTTP API's listener and its server's settings. It is opened before anything else
// starts, so that a mistake in them stops the process at once.
type api struct {
	ln  net.Listener
	cfg httpapi.Config
	url string // http://ADDR or https://ADDR
	// advertise is the URL other coordinators forward to (--advertise, else url with a name
	// others can reach).
	advertise string
	// retainBytes is --retain-bytes, parsed; outputBudget and minFreeDisk --output-budget and
	// --min-free-disk (-1: not checked).
	retainBytes               int64
	outputBudget, minFreeDisk int64
}

// openAPI checks the coordinator's flags, reads the token and the TLS certificate, listens, and makes
// the data directory private: what a coordinator checks before anything starts. Without a token it listens on loopback only:
// anyone who reaches the API runs commands on the runners.
func openAPI(cf coordinatorFlags, log *slog.Logger) (*api, error) {
	if err := checkMaxBlock("--mcp-max-block", cf.mcpMaxBlock); err != nil {
		return nil, err
	}
	retainBytes, err := parseBytes(cf.retainBytes)
	if err != nil || retainBytes <= 0 {
		return nil, usageError("--retain-bytes %q must be a positive size like 10G", cf.retainBytes)
	}
	outputBudget, err := parseBytes(cf.outputBudget)
	if err != nil || outputBudget <= retainBytes {
		return nil, usageError("--output-budget %q must be a size like 20G, above --retain-bytes", cf.outputBudget)
	}
	minFreeDisk, err := parseBytes(cf.minFreeDisk)
	if err != nil || minFreeDisk < 0 {
		return nil, usageError("--min-free-disk %q must be a size like 1G, or 0", cf.minFreeDisk)
	}
	if minFreeDisk == 0 {
		minFreeDisk = -1 // coordinator.Config: not checked
	}
	if cf.runnerDeadline < proto.MinRunnerDeadline {
		return nil, usageError("--runner-deadline %s must be at least %s, as runners refuse a shorter one", cf.runnerDeadline, proto.MinRunnerDeadline)
	}
	if cf.retainAge <= 0 {
		return nil, usageError("--retain-age must be positive")
	}
	if cf.replicas < 1 {
		return nil, usageError("--replicas must be at least 1")
	}
	if cf.leaseTTL != 0 && cf.leaseTTL < 400*time.Millisecond {
		return nil, usageError("--lease-ttl %s must be at least 400ms: the leader renews every quarter of it", cf.leaseTTL)
	}
	token, err := readToken(cf.tokenFile)
	if err != nil {
		return nil, err
	}
	if cf.maxConns <= 0 || cf.maxConnsPerClient <= 0 {
		return nil, usageError("--max-conns and --max-conns-per-client must be positive")
	}
	if cf.mcpSessions.Max <= 0 || cf.mcpSessions.PerToken <= 0 || cf.mcpSessions.Idle <= 0 {
		return nil, usageError("--mcp-max-sessions, --mcp-max-sessions-per-token and --mcp-session-idle must be positive")
	}
	cfg := httpapi.Config{Token: token, Logger: log, Version: version, AllowedHosts: cf.allowHosts,
		MaxConns: cf.maxConns, MaxConnsPerClient: cf.maxConnsPerClient}
	if token == "" && slices.Contains(cf.allowHosts, httpapi.AnyHost) {
		return nil, usageError("--allow-host '*' needs --token-file: without a token, the Host check is what keeps web pages out (DNS rebinding)")
	}
	if (cf.tlsCert == "") != (cf.tlsKey == "") {
		return nil, usageError("--tls-cert and --tls-key go together")
	}
	scheme := "http"
	if cf.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(cf.tlsCert, cf.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("load --tls-cert/--tls-key: %w", err)
		}
		cfg.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		scheme = "https"
	}
	ln, err := net.Listen("tcp", cf.listen)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	if token == "" && !addr.IP.IsLoopback() && !cf.insecureNoToken {
		ln.Close()
		return nil, usageError("refusing to serve the API on %s without a token: whoever reaches it runs commands on the runners. Give --token-file FILE, or listen on 127.0.0.1", cf.listen)
	}
	if err := privateDir(cf.data); err != nil {
		ln.Close()
		return nil, err
	}
	// A client that reaches the API by the address it listens on sends that in Host.
	if host, _, err := net.SplitHostPort(cf.listen); err == nil && host != "" && !addr.IP.IsUnspecified() {
		cfg.AllowedHosts = append(cfg.AllowedHosts, host)
	}
	a := &api{ln: ln, cfg: cfg, url: scheme + "://" + addr.String(), retainBytes: retainBytes, outputBudget: outputBudget, minFreeDisk: minFreeDisk}
	if a.advertise, err = advertiseURL(cf.advertise, scheme, addr); err != nil {
		ln.Close()
		return nil, err
	}
	// Calls forwarded by a standby name this coordinator as it advertises itself.
	if u, err := url.Parse(a.advertise); err == nil {
		a.cfg.AllowedHosts = append(a.cfg.AllowedHosts, u.Hostname())
	}
	return a, nil
}

// advertiseURL is --advertise checked, or the URL of the address listened on, named by the host's
// name when that address is every interface's.
func advertiseURL(flagURL, scheme string, addr *net.TCPAddr) (string, error) {
	if flagURL == "" {
		host := addr.IP.String()
		if addr.IP.IsUnspecified() {
			name, err := os.Hostname()
			if err != nil {
				return "", fmt.Errorf("--advertise is needed: the host's name is unknown: %w", err)
			}
			host = name
		}
		return scheme + "://" + net.JoinHostPort(host, strconv.Itoa(addr.Port)), nil
	}
	u, err := url.Parse(flagURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.User != nil {
		return "", usageError("--advertise %q must be a URL like http://coordinator-1:7070 (scheme and host, no path)", flagURL)
	}
	return u.Scheme + "://" + u.Host, nil
}

// runnerFlags are the flags serve and runner share.
type runnerFlags struct {
	id, pool, cgroupRoot, user, shell string
	users, labels                     stringList
	slots                             int
	allowRootJobs                     bool
	deadline, drainTimeout            time.Duration
	// labelMap is labels, parsed by check.
	labelMap map[string]string
}

// check parses what the flags parser leaves as text, so that a mistake stops the process before it
// connects anywhere.
func (r *runnerFlags) check() error {
	if r.deadline < proto.MinRunnerDeadline {
		return usageError("--runner-deadline %s must be at least %s", r.deadline, proto.MinRunnerDeadline)
	}
	if r.drainTimeout < 0 {
		return usageError("--drain-timeout must not be negative")
	}
	var err error
	r.labelMap, err = parseLabels(r.labels)
	return err
}

func (r *runnerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.id, "id", "", "runner id (default: the one --nats-creds was minted for, else the host name)")
	fs.StringVar(&r.pool, "pool", "default", "pool whose work this runner takes")
	fs.IntVar(&r.slots, "slots", runner.DefaultSlots, "jobs run at once at most (a guard, not a CPU count: dev servers and watchers hold slots for hours)")
	fs.StringVar(&r.cgroupRoot, "cgroup-root", "sbx", "cgroup under which the runner makes its jobs' cgroups")
	fs.StringVar(&r.shell, "shell", "", "absolute path of the shell jobs run in by default (default: bash when installed, else /bin/sh)")
	fs.StringVar(&r.user, "user", "", "user jobs run as (default: a runner run by root: the owner of the job's cwd, or "+runner.JobUser+" when root owns it; serve started with sudo: $SUDO_USER; otherwise the runner's own user)")
	fs.Var(&r.users, "allow-user", "another user a job may ask for with \"user\" (repeatable; needs --user)")
	fs.BoolVar(&r.allowRootJobs, "allow-root-jobs", false, "let jobs run as root: a root runner without --user runs them as itself, and --user or a job may name root. Jobs can then read every secret of the runner")
	fs.Var(&r.labels, "label", "a KEY=VALUE describing the runner in GET /v1/runners (repeatable); placement is by --pool")
}

// registerRunnerDeadline registers the runner's --runner-deadline; serve shares the coordinator's.
func (r *runnerFlags) registerRunnerDeadline(fs *flag.FlagSet) {
	fs.DurationVar(&r.deadline, "runner-deadline", proto.DefaultRunnerDeadline, "the coordinator's --runner-deadline, after which it marks the runner's jobs lost: the runner heartbeats every quarter of it (2 s at most) and its fence kills its jobs when it has been cut off from NATS (or stopped) for the deadline less one heartbeat interval")
}

// maxLabels bounds a runner's labels, which every heartbeat carries.
const maxLabels = 32

// parseLabels turns --label KEY=VALUE flags into a map. A key is 1–63 characters of letters, digits
// and "._-/"; a value at most 256 bytes.
func parseLabels(flags []string) (map[string]string, error) {
	if len(flags) == 0 {
		return nil, nil
	}
	if len(flags) > maxLabels {
		return nil, usageError("--label: at most %d labels", maxLabels)
	}
	labels := make(map[string]string, len(flags))
	for _, f := range flags {
		k, v, ok := strings.Cut(f, "=")
		if !ok || !validLabelKey(k) || len(v) > 256 {
			return nil, usageError("--label %q must be KEY=VALUE, KEY 1-63 characters of letters, digits and ._-/, VALUE at most 256 bytes", f)
		}
		if _, dup := labels[k]; dup {
			return nil, usageError("--label %s is given twice", k)
		}
		labels[k] = v
	}
	return labels, nil
}

func validLabelKey(k string) bool {
	if len(k) == 0 || len(k) > 63 {
		return false
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._-/", c)) {
			return false
		}
	}
	return true
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
	natsListen := fs.String("nats-listen", "127.0.0.1:4222", "address of the embedded NATS server, for more runners (each with creds from 'sbx auth runner --data DIR --id R')")
	natsCert := fs.String("nats-tls-cert", "", "PEM certificate for the embedded NATS server to serve TLS with; needs --nats-tls-key")
	natsKey := fs.String("nats-tls-key", "", "PEM private key of --nats-tls-cert")
	if err := parse(fs, args); err != nil {
		return err
	}
	if rf.user == "" {
		rf.user = defaultUser(getenv)
	}
	rf.deadline = cf.runnerDeadline
	if err := rf.check(); err != nil {
		return err
	}
	if (*natsCert == "") != (*natsKey == "") {
		return usageError("--nats-tls-cert and --nats-tls-key go together")
	}
	if cf.replicas != 1 {
		return usageError("serve --replicas must be 1: its embedded NATS is a single server; run 'sbx coordinator --replicas N' on a NATS cluster")
	}
	cf.leaseTTL = serveLeaseTTL
	log := newLogger(stderr)
	host, port, err := splitHostPort(*natsListen)
	if err != nil {
		return usageError("--nats-listen: %v", err)
	}
	if rf.id == "" {
		if rf.id, err = runner.DefaultID(); err != nil {
			return err
		}
	}
	api, err := openAPI(cf, log)
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
	auth, err := natsauth.Open(filepath.Join(cf.data, serveAuthDir))
	if err != nil {
		return err
	}
	opts := &server.Options{
		ServerName: "sbx", Host: host, Port: port, JetStream: true, NoSigs: true,
		StoreDir: filepath.Join(cf.data, "nats"), MaxPayload: 2 << 20,
	}
	if err := auth.Configure(opts); err != nil {
		return err
	}
	if *natsCert != "" {
		if opts.TLSConfig, err = server.GenTLSConfig(&server.TLSConfigOpts{CertFile: *natsCert, KeyFile: *natsKey}); err != nil {
			return fmt.Errorf("--nats-tls-cert/--nats-tls-key: %w", err)
		}
		opts.TLS = true
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("embedded nats: %w", err)
	}
	ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(30 * time.Second) {
		return errors.New("embedded nats did not start")
	}
	coordCreds, err := auth.CoordinatorCreds()
	if err != nil {
		return err
	}
	runnerCreds, err := auth.RunnerCreds(rf.id, rf.pool, 0)
	if err != nil {
		return usageError("--id: %v", err)
	}
	coordUser, err := credsOption(coordCreds)
	if err != nil {
		return err
	}
	runnerUser, err := credsOption(runnerCreds)
	if err != nil {
		return err
	}
	coordConn, err := connect(log, "sbx-coordinator", "", nats.InProcessServer(ns), coordUser, coordinatorConn())
	if err != nil {
		return err
	}
	defer coordConn.Close()
	runnerConn, err := connect(log, "sbx-runner", "", nats.InProcessServer(ns), runnerUser,
		nats.CustomInboxPrefix(natsauth.RunnerInboxPrefix(rf.id)))
	if err != nil {
		return err
	}
	defer runnerConn.Close()

	// The embedded server has no channel for its end; this goroutine ends with the deferred Shutdown.
	nsDone := make(chan struct{})
	go func() { ns.WaitForShutdown(); close(nsDone) }()

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return supervise(gctx, "coordinator", func(ctx context.Context) error {
			return serveCoordinator(ctx, coordConn, cf, api, true, log, func() {
				fmt.Fprintf(stdout, "sbx %s: API %s, NATS nats://%s, data %s\n", version, api.url, ns.Addr(), cf.data)
			})
		})
	})
	g.Go(func() error {
		return supervise(gctx, "runner", func(ctx context.Context) error { return serveRunner(ctx, runnerConn, rf, secrets, log) })
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

func cmdCoordinator(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlags("coordinator", stderr)
	var cf coordinatorFlags
	var nf natsFlags
	cf.register(fs, getenv)
	cf.registerFleet(fs)
	nf.register(fs)
	enrollKey := fs.String("enroll-key", "", "file (mode 0600) holding the enroll key: enables POST /v1/enroll, which gives runners holding the key creds for the id they ask (needs --nats-account-key)")
	accountKey := fs.String("nats-account-key", "", "the account key (account.nk of sbx auth init) that signs enrolled runners' creds")
	enrollTTL := fs.Duration("enroll-creds-ttl", defaultEnrollTTL, "how long enrolled runners' creds are valid; runners renew them at two thirds")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *enrollTTL < 3*time.Second {
		return usageError("--enroll-creds-ttl %s must be at least 3s", *enrollTTL)
	}
	if nf.url == "" {
		return usageError("coordinator: --nats URL is required")
	}
	if (*enrollKey == "") != (*accountKey == "") {
		return usageError("--enroll-key and --nats-account-key go together")
	}
	opts, err := nf.options("")
	if err != nil {
		return err
	}
	log := newLogger(stderr)
	api, err := openAPI(cf, log)
	if err != nil {
		return err
	}
	defer api.ln.Close()
	if *enrollKey != "" {
		key, err := readToken(*enrollKey)
		if err != nil {
			return fmt.Errorf("--enroll-key: %w", err)
		}
		auth, err := natsauth.LoadAccountKey(*accountKey)
		if err != nil {
			return fmt.Errorf("--nats-account-key: %w", err)
		}
		api.cfg.Enroll = httpapi.NewEnroller(key, auth, *enrollTTL, log)
	}
	nc, err := dial(ctx, log, "sbx-coordinator", nf.url, append(opts, coordinatorConn())...)
	if err != nil || nc == nil {
		return err
	}
	defer nc.Close()
	return supervise(ctx, "coordinator", func(ctx context.Context) error {
		return serveCoordinator(ctx, nc, cf, api, false, log, func() {
			fmt.Fprintf(stdout, "sbx %s: API %s, data %s\n", version, api.url, cf.data)
		})
	})
}

func cmdRunner(ctx context.Context, args []string, _ func(string) string, stderr io.Writer) error {
	fs := newFlags("runner", stderr)
	var rf runnerFlags
	var nf natsFlags
	rf.register(fs)
	rf.registerRunnerDeadline(fs)
	fs.DurationVar(&rf.drainTimeout, "drain-timeout", 0, "on SIGTERM, take no more work and let running jobs finish for up to this long before killing them (0: kill at once)")
	nf.register(fs)
	enrollURL := fs.String("enroll", "", "coordinator URL (several: comma-separated, tried in turn) to get this runner's NATS creds from (POST /v1/enroll) when --nats-creds is not given")
	enrollKeyFile := fs.String("enroll-key-file", "", "file (mode 0600) holding the coordinator's enroll key, for --enroll")
	if err := parse(fs, args); err != nil {
		return err
	}
	if nf.url == "" {
		return usageError("runner: --nats URL is required")
	}
	if (*enrollURL == "") != (*enrollKeyFile == "") {
		return usageError("--enroll and --enroll-key-file go together")
	}
	if *enrollURL != "" && nf.creds != "" {
		return usageError("--enroll is for a runner without --nats-creds")
	}
	if err := rf.check(); err != nil {
		return err
	}
	secrets, err := secretPaths(fs)
	if err != nil {
		return err
	}
	if err := checkSecrets(secrets); err != nil {
		return err
	}
	if rf.id, err = nf.runnerIDFromCreds(rf.id); err != nil {
		return err
	}
	if err := nf.checkCredsPool(rf.pool); err != nil {
		return err
	}
	if rf.id == "" {
		if rf.id, err = runner.DefaultID(); err != nil {
			return err
		}
	}
	opts, err := nf.options(rf.id)
	if err != nil {
		return err
	}
	var enrolled *enrolledCreds
	if *enrollURL != "" {
		key, err := readToken(*enrollKeyFile)
		if err != nil {
			return fmt.Errorf("--enroll-key-file: %w", err)
		}
		if enrolled, err = enrollRunner(ctx, *enrollURL, key, rf.id, rf.pool); err != nil {
			return err
		}
		opts = append(opts, enrolled.option())
	}
	log := newLogger(stderr)
	nc, err := dial(ctx, log, "sbx-runner", nf.url, opts...)
	if err != nil || nc == nil {
		return err
	}
	defer nc.Close()
	if enrolled != nil {
		renewCtx, stopRenew := context.WithCancel(ctx)
		renewed := make(chan struct{})
		go func() { defer close(renewed); enrolled.renew(renewCtx, nc, log) }()
		defer func() { stopRenew(); <-renewed }()
	}
	return serveRunner(ctx, nc, rf, secrets, log)
}

// secretFlags are the flags of serve and runner whose value is a path jobs must not read: keys,
// creds, the token, the data dir that holds serve's authority and store. TestSecretFlags keeps the
// list whole.
var secretFlags = []string{"data", "enroll-key-file", "nats-creds", "nats-tls-key", "tls-key", "token-file"}

// secretPaths returns the absolute, clean paths fs's secret flags hold (data's default included):
// what the runner hides from readonly jobs (runner.Config.Secrets).
func secretPaths(fs *flag.FlagSet) ([]string, error) {
	var out []string
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if p := f.Value.String(); err == nil && p != "" && slices.Contains(secretFlags, f.Name) {
			var abs string
			if abs, err = filepath.Abs(p); err == nil {
				out = append(out, abs)
			}
		}
	})
	return out, err
}

// checkSecrets refuses to start with a secret that a plain job's user could read: one another user
// owns (a root runner runs a job as the owner of its cwd), or that group or others may access.
func checkSecrets(paths []string) error {
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("secret: %w", err)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
			return fmt.Errorf("%s belongs to uid %d, not to uid %d that sbx runs as: a job running as its owner could read it (chown %d %s)", p, st.Uid, os.Geteuid(), os.Geteuid(), p)
		}
		if mode := fi.Mode().Perm(); mode&0o077 != 0 {
			want := "600"
			if fi.IsDir() {
				want = "700"
			}
			return fmt.Errorf("%s has mode %04o: group and others must have no access, or jobs could read it (chmod %s %s)", p, mode, want, p)
		}
	}
	return nil
}

// connect dials NATS with sbx's settings: reconnect forever, notice a dead link within seconds, and
// make a full reconnect buffer an error the publisher sees. opts come last and override them.
func connect(log *slog.Logger, name, url string, opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{
		nats.Name(name),
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

// supervise runs part until ctx ends. A part that returns while ctx is live stopped by itself: that
// is an error even when it says nil, so that the process exits non-zero and whatever supervises it
// (systemd, compose) restarts it. Once ctx ended, the part's cancellation is no error.
func supervise(ctx context.Context, name string, part func(context.Context) error) error {
	err := part(ctx)
	switch {
	case ctx.Err() == nil && err == nil:
		return fmt.Errorf("%s stopped by itself", name)
	case ctx.Err() == nil:
		return fmt.Errorf("%s stopped: %w", name, err)
	case errors.Is(err, context.Canceled):
		return nil
	}
	return err
}

// serveRunner runs a runner until ctx ends. Jobs never see secrets (runner.Config.Secrets).
func serveRunner(ctx context.Context, nc *nats.Conn, rf runnerFlags, secrets []string, log *slog.Logger) error {
	r, err := runner.New(nc, runner.Config{
		ID: rf.id, Pool: rf.pool, Slots: rf.slots, Version: version, Logger: log, User: rf.user, Users: rf.users, AllowRoot: rf.allowRootJobs, Shell: rf.shell,
		Cgroup: sandbox.Config{Root: rf.cgroupRoot}, Secrets: secrets, Labels: rf.labelMap, Deadline: rf.deadline, DrainTimeout: rf.drainTimeout,
	})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}

// minSecret is the shortest token or enroll key sbx accepts, in bytes.
const minSecret = 16

// readToken reads the bearer token from a file; no file means no token. A file that group or
// others may read or write is refused, as ssh refuses such a private key: the token is a root shell
// on every runner. A secret under minSecret bytes is refused too.
func readToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if mode := fi.Mode().Perm(); mode&0o077 != 0 {
		return "", fmt.Errorf("token file %s has mode %04o: group and others must have no access (chmod 600 %s)", path, mode, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	// A short secret is guessed: the enroll route once took 6,276 keys a second.
	if len(token) < minSecret {
		return "", fmt.Errorf("%s holds a secret of %d bytes: use at least %d (head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > %s)", path, len(token), minSecret, path)
	}
	return token, nil
}

// privateDir creates the data directory, or tightens an existing one, to 0700: it holds every
// job's output and the store.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	return nil
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
