package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sbx-dev/sbx/sandbox"
)

// account is the user a job runs as, resolved on this runner; nil runs it as the runner itself.
type account struct {
	name string
	cred *sandbox.Credential
	home string
}

// JobUser is the unprivileged user a root runner without a default user (Config.User) runs a job as
// when the job's cwd belongs to root: `make run`, the systemd unit and the images create it.
const JobUser = "sbx-job"

// noJobUser says how to give a root runner a user to run jobs as, when the job user is missing.
func noJobUser(name string) error {
	return fmt.Errorf("no user to run the job as: its cwd belongs to root, the runner runs as root, and user %s does not exist. "+
		"Create it (useradd --system --create-home --home-dir /var/lib/%s --shell /usr/sbin/nologin %s), "+
		"give the runner --user NAME, or let jobs run as root with --allow-root-jobs", name, name, name)
}

// account resolves the user a job asked for ("" for the runner's default, Config.User) and whose
// cwd is dir. A runner with a default user runs jobs only as that user or one of Config.Users, so an
// API caller cannot pick another. A runner without one runs jobs as itself when it is not root; a
// root runner runs a job as the owner of its cwd, or as JobUser when root owns it, and a job may name
// any other user. No job runs as root unless Config.AllowRoot says so.
func (r *Runner) account(requested string, dir os.FileInfo) (*account, error) {
	name := requested
	if name == "" {
		name = r.cfg.User
	}
	if name == "" {
		if os.Geteuid() != 0 || r.cfg.AllowRoot {
			return nil, nil
		}
		return ownerAccount(dir, r.cfg.jobUser)
	}
	if r.cfg.User != "" && name != r.cfg.User && !slices.Contains(r.cfg.Users, name) {
		allowed := append([]string{r.cfg.User}, r.cfg.Users...)
		return nil, fmt.Errorf("user %s is not allowed on runner %s (allowed: %v)", name, r.cfg.ID, allowed)
	}
	a, err := lookupAccount(name)
	if err != nil {
		return nil, err
	}
	if a.cred.UID == 0 && !r.cfg.AllowRoot {
		return nil, fmt.Errorf("user %s is root, and runner %s runs no job as root (--allow-root-jobs)", name, r.cfg.ID)
	}
	return a, nil
}

// ownerAccount is the account of a directory's owner, or jobUser's when root owns it. An owner the
// user database does not know (a volume made elsewhere) is taken by number, with the directory's group.
func ownerAccount(dir os.FileInfo, jobUser string) (*account, error) {
	st, ok := dir.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, fmt.Errorf("cwd %s: no owner", dir.Name())
	}
	if st.Uid == 0 {
		a, err := lookupAccount(jobUser)
		if errors.As(err, new(user.UnknownUserError)) {
			return nil, noJobUser(jobUser)
		}
		return a, err
	}
	uid := strconv.FormatUint(uint64(st.Uid), 10)
	if _, err := user.LookupId(uid); errors.As(err, new(user.UnknownUserIdError)) {
		return &account{name: uid, cred: &sandbox.Credential{UID: st.Uid, GID: st.Gid}, home: "/"}, nil
	}
	return lookupAccount(uid)
}

// logUsers says at start-up who jobs run as, and warns when that is root or cannot be found.
func (r *Runner) logUsers() {
	log := r.cfg.Logger
	switch {
	case r.cfg.User != "":
		log.Info("jobs run as", "user", r.cfg.User, "allowed", r.cfg.Users, "root_allowed", r.cfg.AllowRoot)
	case os.Geteuid() != 0:
		log.Info("jobs run as the runner's own user", "uid", os.Geteuid())
	case r.cfg.AllowRoot:
		log.Warn("jobs run as root (--allow-root-jobs): a job can read every secret of the runner and of this machine")
	default:
		if _, err := user.Lookup(r.cfg.jobUser); err != nil {
			log.Warn("jobs whose cwd belongs to root will not start", "err", noJobUser(r.cfg.jobUser))
			return
		}
		log.Info("jobs run as the owner of their cwd, or as " + r.cfg.jobUser + " when root owns it")
	}
}

// accountTTL is how long a resolved account is used again: a lookup through the system's user
// database (the user, then its groups) took 0.2 ms here, a fifth of a job's way from being taken to
// its cgroup. A change to the database reaches the jobs started at most this much later.
const accountTTL = time.Second

// maxCachedAccounts bounds the cache: a job may name any user on a root runner without a default.
const maxCachedAccounts = 1024

// accountCache holds the accounts resolved within accountTTL; lookups that failed are not kept.
var accountCache = struct {
	sync.Mutex
	m map[string]cachedAccount
}{m: map[string]cachedAccount{}}

type cachedAccount struct {
	a  *account
	at time.Time
}

// lookupAccount resolves a user name (or a decimal uid) through the system's user database, or
// returns what it resolved for the name within accountTTL.
func lookupAccount(name string) (*account, error) {
	now := time.Now()
	accountCache.Lock()
	c, ok := accountCache.m[name]
	accountCache.Unlock()
	if ok && now.Sub(c.at) < accountTTL {
		return c.a, nil
	}
	a, err := resolveAccount(name)
	if err != nil {
		return nil, err
	}
	accountCache.Lock()
	if len(accountCache.m) >= maxCachedAccounts {
		clear(accountCache.m)
	}
	accountCache.m[name] = cachedAccount{a, now}
	accountCache.Unlock()
	return a, nil
}

// resolveAccount resolves a user name (or a decimal uid) through the system's user database.
func resolveAccount(name string) (*account, error) {
	u, err := user.Lookup(name)
	if _, unknown := err.(user.UnknownUserError); unknown {
		if _, nerr := strconv.ParseUint(name, 10, 32); nerr == nil {
			u, err = user.LookupId(name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("user %s: %w", name, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: uid %q: %w", name, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: gid %q: %w", name, u.Gid, err)
	}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("user %s: groups: %w", name, err)
	}
	cred := &sandbox.Credential{UID: uint32(uid), GID: uint32(gid)}
	for _, id := range ids {
		g, err := strconv.ParseUint(id, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("user %s: group %q: %w", name, id, err)
		}
		cred.Groups = append(cred.Groups, uint32(g))
	}
	if euid := os.Geteuid(); euid != 0 && uint32(euid) != cred.UID {
		return nil, fmt.Errorf("user %s: the runner runs as uid %d, and only root can run jobs as another user", name, euid)
	}
	return &account{name: u.Username, cred: cred, home: u.HomeDir}, nil
}

// env is the variables that name the account, which override the runner's own.
func (a *account) env() map[string]string {
	return map[string]string{"HOME": a.home, "USER": a.name, "LOGNAME": a.name}
}

// probeUser checks that a readonly job can run as an unprivileged user: bwrap then runs
// unprivileged, in a user namespace the kernel must allow. It probes as the default user, or, on a
// root runner that picks the user by the cwd, as JobUser (nobody's uid when JobUser is missing: what
// is probed is the kernel, not the account). The sandbox probe itself (ProbeReadonly) runs as the runner.
func (r *Runner) probeUser(ctx context.Context) error {
	var a *account
	var err error
	switch {
	case r.cfg.User != "":
		a, err = lookupAccount(r.cfg.User)
	case os.Geteuid() != 0 || r.cfg.AllowRoot:
		return nil
	default:
		a, err = lookupAccount(r.cfg.jobUser)
		if errors.As(err, new(user.UnknownUserError)) {
			a, err = &account{name: "uid 65534", cred: &sandbox.Credential{UID: 65534, GID: 65534}}, nil
		}
	}
	if err != nil {
		return err
	}
	p, err := r.mgr.Start(sandbox.Spec{
		ID: "sbx-readonly-probe-user", Path: "/bin/sh", Args: []string{"sh", "-c", "exit 0"}, Dir: "/",
		Env: []string{}, Readonly: true, Credential: a.cred,
	})
	if err != nil {
		return fmt.Errorf("readonly as user %s: %w", a.name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { _ = p.Kill() })
	defer stop()
	out, _ := io.ReadAll(io.LimitReader(p.Output(), 4096))
	_, _ = io.Copy(io.Discard, p.Output())
	res, err := p.Wait()
	if err != nil {
		return fmt.Errorf("readonly as user %s: %w", a.name, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("readonly as user %s: bwrap exited %d: %s", a.name, res.ExitCode, out)
	}
	return nil
}
