package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sbx-dev/sbx/proto"
	"github.com/sbx-dev/sbx/runner"
	"github.com/sbx-dev/sbx/sandbox"
)

// cmdRunner runs a runner against an external NATS, with creds of its own (--nats-creds) or
// enrolled ones (--enroll, enroll.go).
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
	defer drain(nc)
	beats, err := connect(log, "sbx-runner-heartbeats", nf.url, opts...)
	if err != nil {
		return err
	}
	defer drain(beats)
	if enrolled != nil {
		renewCtx, stopRenew := context.WithCancel(ctx)
		renewed := make(chan struct{})
		go func() { defer close(renewed); enrolled.renew(renewCtx, log, nc, beats) }()
		defer func() { stopRenew(); <-renewed }()
	}
	return serveRunner(ctx, nc, beats, rf, secrets, log)
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
	if r.slots < 1 || r.slots > runner.MaxSlots {
		return usageError("--slots %d must be between 1 and %d", r.slots, runner.MaxSlots)
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

// serveRunner runs a runner until ctx ends, its heartbeats on a connection of their own (beats:
// runner.Config.Heartbeats). Jobs never see secrets (runner.Config.Secrets).
func serveRunner(ctx context.Context, nc, beats *nats.Conn, rf runnerFlags, secrets []string, log *slog.Logger) error {
	r, err := runner.New(nc, runner.Config{Heartbeats: beats,
		ID: rf.id, Pool: rf.pool, Slots: rf.slots, Version: version, Logger: log, User: rf.user, Users: rf.users, AllowRoot: rf.allowRootJobs, Shell: rf.shell,
		Cgroup: sandbox.Config{Root: rf.cgroupRoot}, Secrets: secrets, Labels: rf.labelMap, Deadline: rf.deadline, DrainTimeout: rf.drainTimeout,
	})
	if err != nil {
		return err
	}
	return r.Run(ctx)
}
