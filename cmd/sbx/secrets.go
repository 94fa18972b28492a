package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

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
