package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// envConfigs is every start path a job can take here: each cgroup version, and on v1 a cold and a
// warm start (the warm init step gets its job, environment included, over a pipe).
func envConfigs(t *testing.T) map[string]Config {
	configs := map[string]Config{}
	for _, cfg := range testConfigs(t) {
		if cfg.Version == "v1" {
			cold, warm := cfg, cfg
			cold.Warm = -1
			configs["v1-cold"], configs["v1-warm"] = cold, warm
			continue
		}
		configs[cfg.Version] = cfg
	}
	return configs
}

// preloadLib builds a shared library whose constructor creates dir/ran-<euid>-<program name>, so a
// test can see in which process, and as whom, a loader ran it. dir is made writable by everyone, so
// that a job run as nobody can leave its own marker.
func preloadLib(t *testing.T) (lib, dir string) {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not installed")
	}
	base := t.TempDir()
	dir = filepath.Join(base, "markers")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	// Mkdir applies the umask; the directories above must be searchable by nobody.
	for _, d := range []string{dir, base, filepath.Dir(base)} {
		if err := os.Chmod(d, 0o777|os.ModeSticky); err != nil {
			t.Fatal(err)
		}
	}
	src := filepath.Join(base, "preload.c")
	code := fmt.Sprintf(`#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void ran(void) {
	int saved = errno;
	char path[4096];
	snprintf(path, sizeof path, "%%s/ran-%%d-%%s", %q, (int)geteuid(), program_invocation_short_name);
	int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
	if (fd >= 0)
		close(fd);
	errno = saved;
}
`, dir)
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	lib = filepath.Join(base, "preload.so")
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	if err := os.Chmod(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	return lib, dir
}

// filesIn lists dir's entries with the uid that owns each.
func filesIn(t *testing.T, dir string) map[string]uint32 {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]uint32{}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = fi.Sys().(*syscall.Stat_t).Uid
	}
	return files
}

// TestReadonlyEnvOutside: a readonly job's environment acts only inside the sandbox. Before, bwrap
// ran with it, outside every namespace, as the runner's user with every capability: LD_DEBUG with
// LD_DEBUG_OUTPUT made bwrap's loader write a file on the host, and LD_PRELOAD ran any library's
// constructor in bwrap. Both variables still reach the job, whose loader cannot write anything.
func TestReadonlyEnvOutside(t *testing.T) {
	requireReadonly(t)
	lib, dir := preloadLib(t)
	for name, cfg := range envConfigs(t) {
		t.Run(name, func(t *testing.T) {
			m, _ := newTestManager(t, cfg)
			if m.warm != nil {
				waitWarm(t, m)
			}
			code, out := readonlyRun(t, m, "/", `echo "preload=$LD_PRELOAD"`,
				"LD_DEBUG=libs", "LD_DEBUG_OUTPUT="+filepath.Join(dir, "ld-debug"), "LD_PRELOAD="+lib)
			if code != 0 || !strings.Contains(out, "preload="+lib+"\n") {
				t.Errorf("exit code %d, output %q: want the job to see LD_PRELOAD", code, out)
			}
			for f, uid := range filesIn(t, dir) {
				t.Errorf("%s (owner %d) was written on the host: the job's loader variables acted outside the sandbox", f, uid)
				os.Remove(filepath.Join(dir, f))
			}
		})
	}
}

// TestPlainEnvOutside: a plain job run as another user gets its loader variables only in its own
// processes. Before, the v1 init step (run as root, outside the job's cgroup, until it drops to the
// job's user) started with the job's environment: LD_PRELOAD ran the job's library as root.
func TestPlainEnvOutside(t *testing.T) {
	lib, dir := preloadLib(t)
	for name, cfg := range envConfigs(t) {
		t.Run(name, func(t *testing.T) {
			m, _ := newTestManager(t, cfg)
			if m.warm != nil {
				waitWarm(t, m)
			}
			spec := sh("plain-env-"+name, "true")
			spec.Credential = nobody()
			spec.Env = append(spec.Env, "LD_DEBUG=libs", "LD_DEBUG_OUTPUT="+filepath.Join(dir, "ld-debug-"+name), "LD_PRELOAD="+lib)
			res, _ := run(t, m, spec)
			if res.ExitCode != 0 {
				t.Fatalf("exit code %d", res.ExitCode)
			}
			files := filesIn(t, dir)
			ranAsJob := false
			for f, uid := range files {
				if uid != 65534 {
					t.Errorf("%s was written as uid %d: the job's loader variables acted outside the job", f, uid)
				}
				ranAsJob = ranAsJob || strings.HasPrefix(f, "ran-65534-sh")
				os.Remove(filepath.Join(dir, f))
			}
			if !ranAsJob {
				t.Errorf("files %v: want the job's own shell to have loaded the library", files)
			}
		})
	}
}
