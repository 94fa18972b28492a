package runner

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/user"
	"slices"
	"strconv"
	"time"

	"github.com/sbx-dev/sbx/sandbox"
)

// account is the user a job runs as, resolved on this runner; nil runs it as the runner itself.
type account struct {
	name string
	cred *sandbox.Credential
	home string
}

// account resolves the user a job asked for ("" for the runner's default, Config.User). A runner
// with a default user runs jobs only as that user or one of Config.Users, so an API caller cannot
// pick root; a runner without one runs jobs as itself, and a job may then name any user (it can only
// give privileges up).
func (r *Runner) account(requested string) (*account, error) {
	name := requested
	if name == "" {
		name = r.cfg.User
	}
	if name == "" {
		return nil, nil
	}
	if r.cfg.User != "" && name != r.cfg.User && !slices.Contains(r.cfg.Users, name) {
		allowed := append([]string{r.cfg.User}, r.cfg.Users...)
		return nil, fmt.Errorf("user %s is not allowed on runner %s (allowed: %v)", name, r.cfg.ID, allowed)
	}
	return lookupAccount(name)
}

// lookupAccount resolves a user name (or a decimal uid) through the system's user database.
func lookupAccount(name string) (*account, error) {
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

// probeUser checks that a readonly job can run as the default user: bwrap then runs unprivileged, in
// a user namespace the kernel must allow. The sandbox probe itself (ProbeReadonly) runs as the runner.
func (r *Runner) probeUser(ctx context.Context) error {
	a, err := r.account("")
	if a == nil || err != nil {
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
