package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/sbx-dev/sbx/coordinator/natsauth"
)

const authUsage = `usage: sbx auth <command> [flags]

  init   --dir DIR                          make the NATS authority of a fleet: keys, coordinator.creds,
                                            nats-auth.conf for the NATS server to include
  runner (--dir DIR | --data DIR) --id R [--pool P] [--expires D] [--out F]
                                            mint the credentials of runner R (--data: of an sbx serve),
                                            valid for D (default 8760h; 0: no expiry)
  coordinator --dir DIR [--out F]           mint new coordinator creds (rotation: then revoke the old)
  revoke (--dir DIR | --data DIR) (--id R | --creds F)
                                            revoke runner R's creds, or those of creds file F; rewrites
                                            nats-auth.conf (--dir): reload or restart NATS to apply`

// cmdAuth mints NATS credentials: `sbx auth init` and `sbx auth runner`.
func cmdAuth(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, authUsage)
		return &exitError{code: 2}
	}
	switch args[0] {
	case "init":
		return cmdAuthInit(args[1:], stdout, stderr)
	case "runner":
		return cmdAuthRunner(args[1:], stdout, stderr)
	case "coordinator":
		return cmdAuthCoordinator(args[1:], stdout, stderr)
	case "revoke":
		return cmdAuthRevoke(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, authUsage)
		return nil
	}
	fmt.Fprintln(stderr, authUsage)
	return usageError("auth: unknown command %q", args[0])
}

// cmdAuthInit makes (or keeps) the authority in --dir and writes coordinator.creds and
// nats-auth.conf next to its keys.
func cmdAuthInit(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("auth init", stderr)
	dir := fs.String("dir", "", "directory of the authority (created 0700; required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *dir == "" {
		return usageError("auth init: --dir DIR is required")
	}
	a, err := natsauth.Open(*dir)
	if err != nil {
		return err
	}
	conf, err := a.ServerConfig()
	if err != nil {
		return err
	}
	creds, err := a.CoordinatorCreds()
	if err != nil {
		return err
	}
	confPath, credsPath := filepath.Join(*dir, natsauth.ServerConfigFile), filepath.Join(*dir, natsauth.CoordinatorCredsFile)
	if err := natsauth.WriteSecret(confPath, conf); err != nil {
		return err
	}
	if err := natsauth.WriteSecret(credsPath, creds); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s (include it from nats.conf) and %s (sbx coordinator --nats-creds); keep %s offline\n",
		confPath, credsPath, filepath.Join(*dir, natsauth.OperatorSeedFile))
	return nil
}

// cmdAuthRunner mints a runner's credentials from the account key of --dir, or of the serve data
// dir --data, to --out (0600) or stdout.
func cmdAuthRunner(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("auth runner", stderr)
	dir := fs.String("dir", "", "directory of the authority (sbx auth init --dir)")
	data := fs.String("data", "", "data directory of an sbx serve, whose authority to use")
	id := fs.String("id", "", "runner id the credentials are for (required)")
	out := fs.String("out", "", "file to write (0600); default stdout")
	pool := fs.String("pool", "", "the one pool whose work the runner may take (default: any)")
	expires := fs.Duration("expires", defaultRunnerCredsTTL, "how long the credentials are valid (0: no expiry)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *expires < 0 {
		return usageError("auth runner: --expires %s must not be negative", *expires)
	}
	if *id == "" {
		return usageError("auth runner: --id R is required")
	}
	d, err := authDir("runner", *dir, *data)
	if err != nil {
		return err
	}
	a, err := natsauth.LoadAccount(d)
	if err != nil {
		return err
	}
	creds, err := a.RunnerCreds(*id, *pool, *expires)
	if err != nil {
		return usageError("auth runner: %v", err)
	}
	if *out == "" {
		_, err := stdout.Write(creds)
		return err
	}
	return natsauth.WriteSecret(*out, creds)
}

// defaultRunnerCredsTTL is how long `sbx auth runner` creds are valid unless --expires says.
const defaultRunnerCredsTTL = 365 * 24 * time.Hour

// authDir resolves the authority directory of --dir or of the serve data dir --data.
func authDir(cmd, dir, data string) (string, error) {
	if (dir == "") == (data == "") {
		return "", usageError("auth %s: give one of --dir DIR and --data DIR", cmd)
	}
	if data != "" {
		return filepath.Join(data, serveAuthDir), nil
	}
	return dir, nil
}

// cmdAuthCoordinator mints new coordinator creds with a fresh key: the old ones keep working until
// revoked (`sbx auth revoke --creds OLD`), so the coordinator can be restarted on the new ones first.
func cmdAuthCoordinator(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("auth coordinator", stderr)
	dir := fs.String("dir", "", "directory of the authority (sbx auth init --dir; required)")
	out := fs.String("out", "", "file to write (0600); default DIR/"+natsauth.CoordinatorCredsFile)
	if err := parse(fs, args); err != nil {
		return err
	}
	if *dir == "" {
		return usageError("auth coordinator: --dir DIR is required")
	}
	a, err := natsauth.LoadAccount(*dir)
	if err != nil {
		return err
	}
	creds, err := a.CoordinatorCreds()
	if err != nil {
		return err
	}
	if *out == "" {
		*out = filepath.Join(*dir, natsauth.CoordinatorCredsFile)
	}
	if err := natsauth.WriteSecret(*out, creds); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: restart the coordinator with it, then revoke the old creds (sbx auth revoke --creds OLD)\n", *out)
	return nil
}

// cmdAuthRevoke adds a user to the account's revocation list: runner R's (every creds minted for
// it until now) or a creds file's; with --dir it rewrites nats-auth.conf.
func cmdAuthRevoke(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("auth revoke", stderr)
	dir := fs.String("dir", "", "directory of the authority (sbx auth init --dir)")
	data := fs.String("data", "", "data directory of an sbx serve, whose authority to use")
	id := fs.String("id", "", "runner whose creds to revoke")
	credsFile := fs.String("creds", "", "creds file whose user to revoke (an old coordinator.creds)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if (*id == "") == (*credsFile == "") {
		return usageError("auth revoke: give one of --id R and --creds FILE")
	}
	d, err := authDir("revoke", *dir, *data)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(d, natsauth.OperatorSeedFile)); err != nil {
		return fmt.Errorf("auth revoke: the operator key re-signs the account: %w", err)
	}
	a, err := natsauth.Open(d)
	if err != nil {
		return err
	}
	var pub, who string
	if *id != "" {
		if pub, err = a.RunnerPublicKey(*id); err != nil {
			return err
		}
		who = "runner " + *id
	} else {
		b, err := natsauth.ReadSecret(*credsFile)
		if err != nil {
			return fmt.Errorf("--creds: %w", err)
		}
		if pub, err = natsauth.UserOf(b); err != nil {
			return usageError("--creds: %v", err)
		}
		who = "user " + pub
	}
	if err := a.Revoke(pub, time.Now()); err != nil {
		return err
	}
	if *data != "" {
		fmt.Fprintf(stdout, "revoked %s: restart sbx serve to apply\n", who)
		return nil
	}
	conf, err := a.ServerConfig()
	if err != nil {
		return err
	}
	confPath := filepath.Join(d, natsauth.ServerConfigFile)
	if err := natsauth.WriteSecret(confPath, conf); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "revoked %s; wrote %s: reload the NATS server (nats-server --signal reload) to apply\n", who, confPath)
	return nil
}
