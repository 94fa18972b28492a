package runner

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/proto"
)

// TestJobUser: a runner with a default user runs plain and readonly jobs as that user, with its HOME,
// USER and LOGNAME; a job may name another user only when the runner allows it; root is refused.
func TestJobUser(t *testing.T) {
	requireBwrap(t)
	h := newHarness(t)
	id := "user"
	hbs := h.heartbeats(id)
	h.startRunner(Config{ID: id, Slots: 2, User: "nobody", Users: []string{"daemon"}})
	if hb := firstHeartbeat(t, hbs); !hb.Readonly {
		t.Fatalf("readonly probe as nobody failed: %s", hb.ReadonlyReason)
	}
	show := `echo "$(id -un) $(id -u) $HOME $USER $LOGNAME"`
	tests := []struct {
		name     string
		user     string
		readonly bool
		env      map[string]string
		output   string // "" with failed: start_failed naming the user
		failed   string
	}{
		{name: "default", output: "nobody 65534 /nonexistent nobody nobody\n"},
		{name: "default readonly", readonly: true, output: "nobody 65534 /nonexistent nobody nobody\n"},
		{name: "allowed other", user: "daemon", output: "daemon 1 /usr/sbin daemon daemon\n"},
		{name: "job env wins", env: map[string]string{"HOME": "/tmp"}, output: "nobody 65534 /tmp nobody nobody\n"},
		{name: "root refused", user: "root", failed: "user root is not allowed"},
		{name: "uid 0 refused", user: "0", failed: "user 0 is not allowed"},
		{name: "unknown", user: "sbx-no-such-user", failed: "user sbx-no-such-user is not allowed"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			subject := proto.WorkSubject("default", proto.CapPlain)
			if tt.readonly {
				subject = proto.WorkSubject("default", proto.CapReadonly)
			}
			jobID := h.submitWork(subject, &proto.Work{JobID: fmt.Sprintf("%s-%d", id, i), Command: show, Cwd: "/", User: tt.user, Env: tt.env, Readonly: tt.readonly})
			e := h.exited(jobID, 20*time.Second)
			if tt.failed != "" {
				if e.Reason != proto.ReasonStartFailed || !strings.Contains(e.Error, tt.failed) {
					t.Fatalf("exited %+v, want start_failed with %q", e, tt.failed)
				}
				if out := h.out(jobID); out != "" {
					t.Fatalf("a refused job printed %q", out)
				}
				return
			}
			if e.Reason != proto.ReasonExit || e.ExitCode == nil || *e.ExitCode != 0 {
				t.Fatalf("exited %+v (%s)", e, h.out(jobID))
			}
			if got := h.out(jobID); got != tt.output {
				t.Fatalf("output %q, want %q", got, tt.output)
			}
		})
	}
}

// TestRunnerUserConfig: an unknown default user, or other users without a default, fail at start-up.
func TestRunnerUserConfig(t *testing.T) {
	for _, cfg := range []Config{{ID: "x", User: "sbx-no-such-user"}, {ID: "x", Users: []string{"nobody"}}, {ID: "x", User: "nobody", Users: []string{"sbx-no-such-user"}}} {
		if err := cfg.setDefaults(); err == nil {
			t.Errorf("setDefaults(%+v) accepted it", cfg)
		}
	}
}

// ensureJobUser creates JobUser, as `make deps` does, on a machine that lacks it: a root runner
// without a default user runs the jobs whose cwd root owns as JobUser. Test binaries of several
// packages may race to create it; the loser finds it made.
func ensureJobUser(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a user")
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := user.Lookup(JobUser); err == nil {
			return
		}
		out, err := exec.Command("useradd", "--system", "--create-home", "--home-dir", "/var/lib/"+JobUser,
			"--shell", "/usr/sbin/nologin", JobUser).CombinedOutput()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("create user %s: %v: %s", JobUser, err, out)
		}
		time.Sleep(100 * time.Millisecond) // between attempts, while another package's test holds the lock
	}
}

// TestJobUserDefault: a root runner given no user never runs a job as root. It runs a job as the
// owner of its cwd (by number when the user database does not know it), as JobUser when root owns
// the cwd, and refuses a job asking for root; without JobUser such a job fails to start, saying how
// to fix it. Only AllowRoot runs jobs as root.
func TestJobUserDefault(t *testing.T) {
	requireBwrap(t)
	ensureJobUser(t)
	nobodyDir := ownedDir(t, 65534, 65534)
	strangerDir := ownedDir(t, 4242, 4243) // no such user: taken by number
	if _, err := user.LookupId("4242"); err == nil {
		t.Skip("uid 4242 exists on this machine")
	}
	jobUser, err := user.Lookup(JobUser)
	if err != nil {
		t.Fatal(err)
	}
	show := `echo "$(id -u) $(id -g) $HOME"`
	type job struct {
		name, cwd, user string
		readonly        bool
		output, failed  string // failed: start_failed with this in its error
	}
	tests := []struct {
		name string
		cfg  Config
		jobs []job
	}{
		{"default", Config{}, []job{
			{name: "cwd of root", cwd: "/", output: jobUser.Uid + " " + jobUser.Gid + " " + jobUser.HomeDir + "\n"},
			{name: "cwd of root readonly", cwd: "/", readonly: true, output: jobUser.Uid + " " + jobUser.Gid + " " + jobUser.HomeDir + "\n"},
			{name: "cwd of nobody", cwd: nobodyDir, output: "65534 65534 /nonexistent\n"},
			{name: "cwd of an unknown uid", cwd: strangerDir, output: "4242 4243 /\n"},
			{name: "another user", cwd: "/", user: "nobody", output: "65534 65534 /nonexistent\n"},
			{name: "root refused", cwd: "/", user: "root", failed: "runs no job as root (--allow-root-jobs)"},
			{name: "uid 0 refused", cwd: "/", user: "0", failed: "runs no job as root"},
		}},
		{"no job user", Config{jobUser: "sbx-no-such-user"}, []job{
			{name: "cwd of root", cwd: "/", failed: "user sbx-no-such-user does not exist. Create it (useradd --system"},
			{name: "cwd of nobody", cwd: nobodyDir, output: "65534 65534 /nonexistent\n"},
		}},
		{"allow root", Config{AllowRoot: true}, []job{
			{name: "cwd of root", cwd: "/", output: "0 0 " + os.Getenv("HOME") + "\n"},
			{name: "cwd of nobody", cwd: nobodyDir, output: "0 0 " + os.Getenv("HOME") + "\n"},
			{name: "root", cwd: "/", user: "root", output: "0 0 /root\n"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			id := "user-" + strings.ReplaceAll(tt.name, " ", "-")
			cfg := tt.cfg
			cfg.ID, cfg.Slots = id, 2
			cfg.Environ = []string{"PATH=/usr/bin:/bin", "HOME=" + os.Getenv("HOME")}
			hbs := h.heartbeats(id)
			h.startRunner(cfg)
			if hb := firstHeartbeat(t, hbs); !hb.Readonly {
				t.Fatalf("readonly probe failed: %s", hb.ReadonlyReason)
			}
			for i, j := range tt.jobs {
				subject := proto.WorkSubject("default", proto.CapPlain)
				if j.readonly {
					subject = proto.WorkSubject("default", proto.CapReadonly)
				}
				jobID := h.submitWork(subject, &proto.Work{JobID: fmt.Sprintf("%s-%d", id, i), Command: show, Cwd: j.cwd, User: j.user, Readonly: j.readonly})
				e := h.exited(jobID, 20*time.Second)
				if j.failed != "" {
					if e.Reason != proto.ReasonStartFailed || !strings.Contains(e.Error, j.failed) {
						t.Errorf("%s: exited %+v, want start_failed with %q", j.name, e, j.failed)
					}
					continue
				}
				if e.Reason != proto.ReasonExit || e.ExitCode == nil || *e.ExitCode != 0 {
					t.Errorf("%s: exited %+v (%s)", j.name, e, h.out(jobID))
				} else if got := h.out(jobID); got != j.output {
					t.Errorf("%s: output %q, want %q", j.name, got, j.output)
				}
			}
		})
	}
}

// TestRunnerRootUser: a default or allowed user that is root needs AllowRoot.
func TestRunnerRootUser(t *testing.T) {
	for _, cfg := range []Config{{ID: "x", User: "root"}, {ID: "x", User: "0"}, {ID: "x", User: "nobody", Users: []string{"root"}}} {
		if err := cfg.setDefaults(); err == nil || !strings.Contains(err.Error(), "--allow-root-jobs") {
			t.Errorf("setDefaults(%+v) = %v, want it refused", cfg, err)
		}
		cfg.AllowRoot = true
		if err := cfg.setDefaults(); err != nil {
			t.Errorf("setDefaults(%+v) = %v", cfg, err)
		}
	}
}

// jobUserDir returns a new directory that JobUser owns and can reach: a job run there runs as JobUser.
func jobUserDir(t *testing.T) string {
	t.Helper()
	u, err := user.Lookup(JobUser)
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return ownedDir(t, uid, gid)
}

// ownedDir returns a new directory owned by uid:gid that any user can reach.
func ownedDir(t *testing.T, uid, gid int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory away")
	}
	dir := filepath.Join(t.TempDir(), "owned")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	// t.TempDir's own directories are 0700: open the way.
	for d := filepath.Dir(dir); d != "/"; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// TestLogUsers: a root runner says at start who its jobs run as, and warns when that is root.
func TestLogUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a runner that is not root runs jobs as itself")
	}
	ensureJobUser(t)
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{AllowRoot: true}, `level=WARN msg="jobs run as root (--allow-root-jobs)`},
		{Config{jobUser: JobUser}, "the owner of their cwd, or as " + JobUser},
		{Config{jobUser: "sbx-no-such-user"}, "level=WARN msg=\"jobs whose cwd belongs to root will not start\" err=\"no user to run the job as"},
		{Config{User: "nobody"}, "msg=\"jobs run as\" user=nobody"},
	} {
		var buf bytes.Buffer
		tt.cfg.Logger = slog.New(slog.NewTextHandler(&buf, nil))
		(&Runner{cfg: tt.cfg}).logUsers()
		if !strings.Contains(buf.String(), tt.want) {
			t.Errorf("%+v logged %q, want %q", tt.cfg, buf.String(), tt.want)
		}
	}
}

// TestAccountCache: an account is resolved once within accountTTL and again after it, so that a
// change to the user database reaches later jobs.
func TestAccountCache(t *testing.T) {
	first, err := lookupAccount("root")
	if err != nil {
		t.Fatal(err)
	}
	again, err := lookupAccount("root")
	if err != nil || again != first {
		t.Fatalf("second lookup within the TTL = %p, %v; want the cached %p", again, err, first)
	}
	accountCache.Lock()
	c := accountCache.m["root"]
	c.at = c.at.Add(-accountTTL)
	accountCache.m["root"] = c
	accountCache.Unlock()
	fresh, err := lookupAccount("root")
	if err != nil || fresh == first || fresh.cred.UID != 0 {
		t.Fatalf("lookup past the TTL = %+v, %v; want a new resolution of root", fresh, err)
	}
	if _, err := lookupAccount("sbx-no-such-user"); err == nil {
		t.Fatal("an unknown user resolved")
	}
	accountCache.Lock()
	_, kept := accountCache.m["sbx-no-such-user"]
	accountCache.Unlock()
	if kept {
		t.Error("a failed lookup was cached")
	}
}
