package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-dev/sbx/coordinator"
	"github.com/sbx-dev/sbx/coordinator/httpapi"
	"github.com/sbx-dev/sbx/coordinator/mcp"
	"github.com/sbx-dev/sbx/coordinator/natsauth"
	"github.com/sbx-dev/sbx/coordinator/natsbus"
	"github.com/sbx-dev/sbx/proto"
)

// defaultEnrollTTL is how long enrolled creds are valid unless --enroll-creds-ttl says.
const defaultEnrollTTL = 24 * time.Hour

// cmdCoordinator runs a coordinator against an external NATS: a standby that forwards the API's
// calls until it holds the lease, then the leader (lead.go).
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
	defer drain(nc)
	return supervise(ctx, "coordinator", func(ctx context.Context) error {
		return serveCoordinator(ctx, nc, cf, api, false, log, func() {
			fmt.Fprintf(stdout, "sbx %s: API %s, data %s\n", version, api.url, cf.data)
		})
	})
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

// registerFleet registers the flags of a coordinator that shares its NATS with others.
func (c *coordinatorFlags) registerFleet(fs *flag.FlagSet) {
	fs.StringVar(&c.advertise, "advertise", "", "URL the other coordinators forward calls to while this one leads (default: http(s)://LISTEN, with the host's name when LISTEN is 0.0.0.0 or [::])")
	fs.DurationVar(&c.leaseTTL, "lease-ttl", natsbus.DefaultLeaseTTL, "how long a leading coordinator may go unheard before another takes over (give every coordinator the same)")
}

// apiListener is the HTTP API's listener and its server's settings. It is opened before anything else
// starts, so that a mistake in them stops the process at once.
type apiListener struct {
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
func openAPI(cf coordinatorFlags, log *slog.Logger) (*apiListener, error) {
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
	a := &apiListener{ln: ln, cfg: cfg, url: scheme + "://" + addr.String(), retainBytes: retainBytes, outputBudget: outputBudget, minFreeDisk: minFreeDisk}
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
