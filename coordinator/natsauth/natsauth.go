// Package natsauth mints sbx's NATS credentials: an operator, the sbx account and the system
// account as nkeys, the JWTs NATS's operator mode trusts, and a user per role — the coordinator, and
// one per runner id — whose permissions hold it to its own subjects (see docs/security.md).
package natsauth

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/sbx-dev/sbx/proto"
)

// Files of an authority directory.
const (
	// OperatorSeedFile signs the account JWTs: needed by `sbx auth init` only, keep it offline after.
	OperatorSeedFile = "operator.nk"
	// AccountSeedFile signs user JWTs: whoever holds it mints any runner's or the coordinator's creds.
	AccountSeedFile = "account.nk"
	// SystemSeedFile is the system account's key.
	SystemSeedFile = "system.nk"
	// ServerConfigFile is the NATS server configuration include (operator, resolver, preload).
	ServerConfigFile = "nats-auth.conf"
	// CoordinatorCredsFile is the coordinator's credentials.
	CoordinatorCredsFile = "coordinator.creds"
	// RevocationsFile lists the revoked users (public key → unix time: creds issued up to then are
	// refused), which the account JWT carries.
	RevocationsFile = "revocations.json"
	// OperatorJWTFile keeps the operator JWT, which must not change under a running server.
	OperatorJWTFile = "operator.jwt"
)

// Name is the name of the sbx account and the prefix of the operator's.
const Name = "sbx"

// CoordinatorUser is the name of the coordinator's user.
const CoordinatorUser = "sbx-coordinator"

// runnerUserPrefix starts the name of a runner's user; the runner id follows.
const runnerUserPrefix = "sbx-runner-"

// ErrNoAuthority is returned when a directory holds no account key.
var ErrNoAuthority = errors.New("natsauth: no account key")

// Authority holds the keys of an sbx NATS deployment. The operator and system keys are nil when
// only the account key was loaded (LoadAccount): then it mints users but no server configuration.
type Authority struct {
	operator, account, system nkeys.KeyPair
	// dir is the authority's directory ("" when only the account key was loaded): its
	// RevocationsFile goes into the account JWT.
	dir string
}

// Open loads the authority kept in dir, creating it (dir 0700, files 0600) on first use.
func Open(dir string) (*Authority, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("auth dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("auth dir: %w", err)
	}
	a := &Authority{dir: dir}
	for _, k := range []struct {
		file   string
		prefix nkeys.PrefixByte
		kp     *nkeys.KeyPair
	}{
		{OperatorSeedFile, nkeys.PrefixByteOperator, &a.operator},
		{AccountSeedFile, nkeys.PrefixByteAccount, &a.account},
		{SystemSeedFile, nkeys.PrefixByteAccount, &a.system},
	} {
		kp, err := loadOrCreate(filepath.Join(dir, k.file), k.prefix)
		if err != nil {
			return nil, err
		}
		*k.kp = kp
	}
	return a, nil
}

// LoadAccount loads only the account key of dir: enough to mint users.
func LoadAccount(dir string) (*Authority, error) {
	a, err := LoadAccountKey(filepath.Join(dir, AccountSeedFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s (run `sbx auth init --dir %s` first)", ErrNoAuthority, dir, dir)
	}
	return a, err
}

// LoadAccountKey loads the account key from its seed file (AccountSeedFile of an authority).
func LoadAccountKey(path string) (*Authority, error) {
	kp, err := loadSeed(path, nkeys.PrefixByteAccount)
	if err != nil {
		return nil, err
	}
	return &Authority{account: kp}, nil
}

// loadOrCreate reads a seed file, or makes a new key of the kind and writes its seed (0600).
func loadOrCreate(path string, prefix nkeys.PrefixByte) (nkeys.KeyPair, error) {
	kp, err := loadSeed(path, prefix)
	if !errors.Is(err, os.ErrNotExist) {
		return kp, err
	}
	kp, err = nkeys.CreatePair(prefix)
	if err != nil {
		return nil, fmt.Errorf("create key: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	if err := WriteSecret(path, append(seed, '\n')); err != nil {
		return nil, err
	}
	return kp, nil
}

// loadSeed reads a seed file, refusing one that group or others may read, and checks its kind.
func loadSeed(path string, prefix nkeys.PrefixByte) (nkeys.KeyPair, error) {
	b, err := ReadSecret(path)
	if err != nil {
		return nil, err
	}
	kp, err := nkeys.FromSeed(bytes.TrimSpace(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	if nkeys.Prefix(pub) != prefix {
		return nil, fmt.Errorf("%s holds a key of the wrong kind", path)
	}
	return kp, nil
}

// ReadSecret reads a file holding a secret, refusing one that group or others may access: as ssh
// refuses such a private key.
func ReadSecret(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if mode := fi.Mode().Perm(); mode&0o077 != 0 {
		return nil, fmt.Errorf("%s has mode %04o: group and others must have no access (chmod 600 %s)", path, mode, path)
	}
	return os.ReadFile(path)
}

// WriteSecret writes a secret file with mode 0600, replacing any earlier one whole.
func WriteSecret(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func publicKey(kp nkeys.KeyPair) string {
	pub, err := kp.PublicKey()
	if err != nil {
		panic("natsauth: public key of a loaded key: " + err.Error())
	}
	return pub
}

// operatorJWT returns the operator JWT, made once and kept in OperatorJWTFile: a NATS server refuses
// to reload a configuration whose operator changed, and each encoding is another (its issue time),
// so revoking (which rewrites the account JWT) keeps the operator's.
func (a *Authority) operatorJWT() (*jwt.OperatorClaims, string, error) {
	if a.dir != "" {
		b, err := os.ReadFile(filepath.Join(a.dir, OperatorJWTFile))
		if err == nil {
			token := strings.TrimSpace(string(b))
			op, err := jwt.DecodeOperatorClaims(token)
			if err == nil && op.Subject == publicKey(a.operator) && op.SystemAccount == publicKey(a.system) {
				return op, token, nil
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, "", fmt.Errorf("operator jwt: %w", err)
		}
	}
	op := jwt.NewOperatorClaims(publicKey(a.operator))
	op.Name = Name + "-operator"
	op.SystemAccount = publicKey(a.system)
	token, err := op.Encode(a.operator)
	if err != nil {
		return nil, "", fmt.Errorf("operator jwt: %w", err)
	}
	if a.dir != "" {
		if err := WriteSecret(filepath.Join(a.dir, OperatorJWTFile), []byte(token+"\n")); err != nil {
			return nil, "", fmt.Errorf("operator jwt: %w", err)
		}
	}
	return op, token, nil
}

// jwts mints the operator JWT and the JWTs of the sbx and system accounts.
func (a *Authority) jwts() (op *jwt.OperatorClaims, opJWT, accJWT, sysJWT string, err error) {
	if a.operator == nil {
		return nil, "", "", "", errors.New("natsauth: the operator key was not loaded")
	}
	if op, opJWT, err = a.operatorJWT(); err != nil {
		return nil, "", "", "", err
	}
	acc := jwt.NewAccountClaims(publicKey(a.account))
	acc.Name = Name
	// JetStream on, bounded by the server's own limits.
	acc.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	revoked, err := a.revocations()
	if err != nil {
		return nil, "", "", "", err
	}
	for pub, at := range revoked {
		acc.RevokeAt(pub, time.Unix(at, 0))
	}
	if accJWT, err = acc.Encode(a.operator); err != nil {
		return nil, "", "", "", fmt.Errorf("account jwt: %w", err)
	}
	sys := jwt.NewAccountClaims(publicKey(a.system))
	sys.Name = "SYS"
	if sysJWT, err = sys.Encode(a.operator); err != nil {
		return nil, "", "", "", fmt.Errorf("system account jwt: %w", err)
	}
	return op, opJWT, accJWT, sysJWT, nil
}

// Configure puts a server in operator mode: it trusts this authority's operator, resolves the two
// accounts from memory and admits no client without a user JWT signed by the sbx account.
func (a *Authority) Configure(o *server.Options) error {
	op, _, accJWT, sysJWT, err := a.jwts()
	if err != nil {
		return err
	}
	res := &server.MemAccResolver{}
	if err := res.Store(publicKey(a.account), accJWT); err != nil {
		return err
	}
	if err := res.Store(publicKey(a.system), sysJWT); err != nil {
		return err
	}
	o.TrustedOperators = []*jwt.OperatorClaims{op}
	o.SystemAccount = publicKey(a.system)
	o.AccountResolver = res
	return nil
}

// ServerConfig is the NATS configuration include for an external server (nats-auth.conf): the
// operator JWT, the system account and a memory resolver preloaded with both accounts.
func (a *Authority) ServerConfig() ([]byte, error) {
	_, opJWT, accJWT, sysJWT, err := a.jwts()
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Written by `sbx auth init`: NATS in operator mode for sbx. Anonymous clients are refused;\n")
	fmt.Fprintf(&b, "# each sbx user holds creds minted by `sbx auth`. Regenerate rather than edit.\n")
	fmt.Fprintf(&b, "operator: %s\n", opJWT)
	fmt.Fprintf(&b, "system_account: %s\n", publicKey(a.system))
	fmt.Fprintf(&b, "resolver: MEMORY\n")
	fmt.Fprintf(&b, "resolver_preload: {\n  %s: %s\n  %s: %s\n}\n", publicKey(a.account), accJWT, publicKey(a.system), sysJWT)
	return b.Bytes(), nil
}

// CoordinatorPermissions are the coordinator's: sbx's subjects, the JetStream API and acks, the
// writes of its buckets (idempotency keys, the state, the notifications, the leader lease), its inbox, and the micro discovery subjects; and the answers to the requests it gets (a runner's
// start confirmation, whose reply goes to the runner's own inbox).
func CoordinatorPermissions() jwt.Permissions {
	return jwt.Permissions{
		Pub:  jwt.Permission{Allow: []string{"sbx.v1.>", "$JS.API.>", "$JS.ACK.>", "$KV.SBX_IDEMPOTENCY.>", "$KV.SBX_STATE.>", "$KV.SBX_NOTES.>", "$KV.SBX_LEASE.>", "_INBOX.>", "$SRV.>"}},
		Sub:  jwt.Permission{Allow: []string{"sbx.v1.>", "_INBOX.>", "$SRV.>"}},
		Resp: &jwt.ResponsePermission{MaxMsgs: 1, Expires: time.Minute},
	}
}

// RunnerInboxPrefix is the inbox prefix of runner id (nats.CustomInboxPrefix): a runner subscribes to
// its own inbox only, so no runner reads another's replies.
func RunnerInboxPrefix(id string) string { return proto.RunnerInbox(id) }

// RunnerPermissions hold runner id to its own subjects. It publishes its events (JetStream publishes
// are plain publishes with a reply to its inbox) and heartbeats for its pools, binds to and pulls
// from its pools' work consumers through the coordinator (proto.PullPrefix) and acks what it took,
// and asks the coordinator to confirm the start of expired work (proto.ConfirmSubject); it
// subscribes to its control subject, micro discovery and its inbox, and answers the requests it
// gets. It cannot publish work, read the work or event subjects, publish another runner's events or
// heartbeats, name a pool its creds do not in a heartbeat, send any request to the JetStream API
// (whose replies and deliveries it could aim at a stream), or create, change or delete streams and
// consumers. With a pool, it reaches only that pool; "" allows every pool.
func RunnerPermissions(id, pool string) jwt.Permissions {
	ws := proto.WorkStream
	consumers, pools := []string{"*"}, "*"
	if pool != "" {
		consumers, pools = []string{proto.WorkConsumer(pool, proto.CapPlain), proto.WorkConsumer(pool, proto.CapReadonly)}, pool
	}
	pub := []string{proto.RunnerEventSubjects(id), proto.HeartbeatSubject(id, pools), proto.ConfirmSubject(id)}
	for _, c := range consumers {
		pub = append(pub,
			proto.PullPrefix(id)+".CONSUMER.INFO."+ws+"."+c,
			proto.PullPrefix(id)+".CONSUMER.MSG.NEXT."+ws+"."+c,
			"$JS.ACK."+ws+"."+c+".>",
		)
	}
	return jwt.Permissions{
		Pub: jwt.Permission{Allow: pub},
		Sub: jwt.Permission{Allow: []string{
			proto.ControlSubject(id),
			"$SRV.>",
			proto.RunnerInbox(id) + ".>",
		}},
		Resp: &jwt.ResponsePermission{MaxMsgs: 1, Expires: time.Minute},
	}
}

// CoordinatorCreds mints the coordinator's credentials file, with a fresh key each time: minting new
// ones and revoking the old (RevokeCreds) rotates them.
func (a *Authority) CoordinatorCreds() ([]byte, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	return a.user(kp, CoordinatorUser, CoordinatorPermissions(), 0)
}

// RunnerCreds mints the credentials file of runner id, limited to the work of pool ("": any pool),
// valid for ttl (0: no expiry).
func (a *Authority) RunnerCreds(id, pool string, ttl time.Duration) ([]byte, error) {
	if !proto.ValidToken(id) {
		return nil, fmt.Errorf("runner id %q must be 1-64 characters of letters, digits, '_' and '-'", id)
	}
	if pool != "" && !proto.ValidToken(pool) {
		return nil, fmt.Errorf("pool %q must be 1-64 characters of letters, digits, '_' and '-'", pool)
	}
	kp, err := a.runnerKey(id)
	if err != nil {
		return nil, err
	}
	return a.user(kp, runnerUserPrefix+id, RunnerPermissions(id, pool), ttl)
}

// runnerKey is the user key of runner id: derived from the account key and the id, so that every
// creds minted for the runner share one public key, which RevokeRunner revokes.
func (a *Authority) runnerKey(id string) (nkeys.KeyPair, error) {
	seed, err := a.account.Seed()
	if err != nil {
		return nil, err
	}
	mac := hmac.New(sha256.New, seed)
	mac.Write([]byte("sbx runner user\x00" + id))
	return nkeys.FromRawSeed(nkeys.PrefixByteUser, mac.Sum(nil))
}

// RunnerPublicKey is the public key of runner id's user.
func (a *Authority) RunnerPublicKey(id string) (string, error) {
	kp, err := a.runnerKey(id)
	if err != nil {
		return "", err
	}
	return kp.PublicKey()
}

// revocations reads the RevocationsFile of the authority's directory.
func (a *Authority) revocations() (map[string]int64, error) {
	revoked := map[string]int64{}
	if a.dir == "" {
		return revoked, nil
	}
	b, err := os.ReadFile(filepath.Join(a.dir, RevocationsFile))
	if errors.Is(err, os.ErrNotExist) {
		return revoked, nil
	}
	if err != nil {
		return nil, fmt.Errorf("revocations: %w", err)
	}
	if err := json.Unmarshal(b, &revoked); err != nil {
		return nil, fmt.Errorf("revocations: %s: %w", filepath.Join(a.dir, RevocationsFile), err)
	}
	return revoked, nil
}

// Revoke revokes the user whose public key is pub: creds of it issued up to at are refused once the
// NATS server has the account JWT that ServerConfig (or Configure) now makes.
func (a *Authority) Revoke(pub string, at time.Time) error {
	if a.dir == "" || a.operator == nil {
		return errors.New("natsauth: revoking needs the authority's directory with its operator key")
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		return fmt.Errorf("%q is not a user's public key", pub)
	}
	revoked, err := a.revocations()
	if err != nil {
		return err
	}
	revoked[pub] = at.Unix()
	b, err := json.MarshalIndent(revoked, "", "  ")
	if err != nil {
		return err
	}
	return WriteSecret(filepath.Join(a.dir, RevocationsFile), append(b, '\n'))
}

// userClaims decodes the user JWT of a credentials file.
func userClaims(creds []byte) (*jwt.UserClaims, error) {
	token, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	return uc, nil
}

// UserOf returns the public key of a credentials file's user.
func UserOf(creds []byte) (string, error) {
	uc, err := userClaims(creds)
	if err != nil {
		return "", err
	}
	return uc.Subject, nil
}

// Lifetime returns when a credentials file was issued and when it expires (zero: never).
func Lifetime(creds []byte) (issued, expires time.Time, err error) {
	uc, err := userClaims(creds)
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	issued = time.Unix(uc.IssuedAt, 0)
	if uc.Expires != 0 {
		expires = time.Unix(uc.Expires, 0)
	}
	return issued, expires, nil
}

// user mints a user of the sbx account with key kp, valid for ttl (0: no expiry), and returns its
// credentials file (the user JWT and its seed).
func (a *Authority) user(kp nkeys.KeyPair, name string, perms jwt.Permissions, ttl time.Duration) ([]byte, error) {
	uc := jwt.NewUserClaims(publicKey(kp))
	uc.Name = name
	uc.Permissions = perms
	if ttl > 0 {
		uc.Expires = time.Now().Add(ttl).Unix()
	}
	token, err := uc.Encode(a.account)
	if err != nil {
		return nil, fmt.Errorf("user jwt: %w", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(token, seed)
}

// RunnerOf returns the runner id a credentials file was minted for ("" for the coordinator's or
// any other user's).
func RunnerOf(creds []byte) (string, error) {
	uc, err := userClaims(creds)
	if err != nil {
		return "", err
	}
	id, _ := strings.CutPrefix(uc.Name, runnerUserPrefix)
	if id == uc.Name {
		return "", nil
	}
	return id, nil
}

// PoolOf returns the pool a runner's credentials file is limited to ("" for any pool, or for creds
// that are not a runner's): the last token of the heartbeat subject it may publish.
func PoolOf(creds []byte) (string, error) {
	id, err := RunnerOf(creds)
	if err != nil || id == "" {
		return "", err
	}
	uc, err := userClaims(creds)
	if err != nil {
		return "", err
	}
	for _, subject := range uc.Pub.Allow {
		if rid, pool, ok := proto.ParseHeartbeatSubject(subject); ok && rid == id {
			return pool, nil
		}
	}
	return "", nil
}

// Split returns the user JWT and seed of a credentials file, for an in-process connection.
func Split(creds []byte) (token string, seed []byte, err error) {
	if token, err = jwt.ParseDecoratedJWT(creds); err != nil {
		return "", nil, fmt.Errorf("credentials: %w", err)
	}
	kp, err := jwt.ParseDecoratedUserNKey(creds)
	if err != nil {
		return "", nil, fmt.Errorf("credentials: %w", err)
	}
	if seed, err = kp.Seed(); err != nil {
		return "", nil, err
	}
	return token, seed, nil
}
