package natsauth

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/sbx-dev/sbx/coordinator/natsbus"
	"github.com/sbx-dev/sbx/internal/natstest"
	"github.com/sbx-dev/sbx/proto"
)

// startServer runs a NATS server in operator mode for a fresh authority.
func startServer(t *testing.T) (*server.Server, *Authority, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "auth")
	a, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir()}
	if err := a.Configure(opts); err != nil {
		t.Fatal(err)
	}
	ns := natstest.Run(t, opts)
	return ns, a, dir
}

// connectAs connects with creds, collecting the permission errors the server reports.
func connectAs(t *testing.T, url string, creds []byte, opts ...nats.Option) (*nats.Conn, <-chan error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "user.creds")
	if err := WriteSecret(path, creds); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 64)
	opts = append(opts, nats.UserCredentials(path), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, errs
}

// wantViolation waits for a permissions violation naming subject.
func wantViolation(t *testing.T, errs <-chan error, subject string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case err := <-errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subject) {
				return
			}
		case <-deadline:
			t.Fatalf("no permissions violation for %s", subject)
		}
	}
}

func TestFilesArePrivateAndReused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "auth")
	a, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("dir mode %v (%v), want 0700", fi.Mode().Perm(), err)
	}
	for _, f := range []string{OperatorSeedFile, AccountSeedFile, SystemSeedFile} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode %v (%v), want 0600", f, fi.Mode().Perm(), err)
		}
	}
	again, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if publicKey(again.account) != publicKey(a.account) || publicKey(again.operator) != publicKey(a.operator) {
		t.Fatal("a second Open made new keys")
	}
	if err := os.Chmod(filepath.Join(dir, AccountSeedFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadAccount(dir); err == nil || !strings.Contains(err.Error(), "0644") {
		t.Fatalf("a world-readable account key was loaded: %v", err)
	}
	if _, err := LoadAccount(t.TempDir()); !errors.Is(err, ErrNoAuthority) {
		t.Fatalf("LoadAccount of an empty dir: %v", err)
	}
}

func TestAnonymousRefused(t *testing.T) {
	ns, _, _ := startServer(t)
	if nc, err := nats.Connect(ns.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("an anonymous client connected")
	}
	// Creds of another authority are refused too.
	otherAuth, err := Open(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	creds, err := otherAuth.CoordinatorCreds()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "c.creds")
	if err := WriteSecret(path, creds); err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(path)); err == nil {
		nc.Close()
		t.Fatal("a client of another operator connected")
	}
}

// TestRunnerPermissions: a runner's user can do what a runner does and nothing of what an attacker
// holding its creds would want: publish work, read work or events, speak for another runner, or
// delete streams and consumers.
func TestRunnerPermissions(t *testing.T) {
	ns, a, _ := startServer(t)
	ctx := t.Context()
	ccreds, err := a.CoordinatorCreds()
	if err != nil {
		t.Fatal(err)
	}
	coord, _ := connectAs(t, ns.ClientURL(), ccreds)
	cjs, err := jetstream.New(coord)
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range []jetstream.StreamConfig{
		{Name: proto.WorkStream, Subjects: []string{proto.WorkSubjects}, Retention: jetstream.WorkQueuePolicy},
		{Name: proto.EventStream, Subjects: []string{proto.EventSubjects}, Retention: jetstream.WorkQueuePolicy},
	} {
		if _, err := cjs.CreateStream(ctx, sc); err != nil {
			t.Fatalf("the coordinator cannot create %s: %v", sc.Name, err)
		}
	}
	work := proto.WorkConsumer("default", proto.CapPlain)
	if _, err := cjs.CreateConsumer(ctx, proto.WorkStream, jetstream.ConsumerConfig{
		Durable: work, FilterSubject: proto.WorkSubject("default", proto.CapPlain), AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatal(err)
	}
	other := proto.WorkConsumer("other", proto.CapPlain)
	if _, err := cjs.CreateConsumer(ctx, proto.WorkStream, jetstream.ConsumerConfig{
		Durable: other, FilterSubject: proto.WorkSubject("other", proto.CapPlain), AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := cjs.Publish(ctx, proto.WorkSubject("default", proto.CapPlain), []byte("job")); err != nil {
		t.Fatalf("the coordinator cannot queue work: %v", err)
	}
	// The coordinator forwards pulls to JetStream (natsbus.Bus.forwardPull, which checks the reply).
	if _, err := coord.Subscribe(proto.PullSubjects, func(m *nats.Msg) {
		_, api, _ := strings.Cut(strings.TrimPrefix(m.Subject, proto.PullPrefix("")), ".")
		_ = coord.PublishMsg(&nats.Msg{Subject: "$JS.API." + api, Reply: m.Reply, Data: m.Data})
	}); err != nil {
		t.Fatal(err)
	}
	heard := make(chan string, 16)
	if _, err := coord.Subscribe(proto.HeartbeatSubjects, func(m *nats.Msg) { heard <- m.Subject }); err != nil {
		t.Fatal(err)
	}
	if err := coord.Flush(); err != nil {
		t.Fatal(err)
	}

	rcreds, err := a.RunnerCreds("r1", "default", 0)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := RunnerOf(rcreds); err != nil || id != "r1" {
		t.Fatalf("RunnerOf = %q, %v", id, err)
	}
	if id, err := RunnerOf(ccreds); err != nil || id != "" {
		t.Fatalf("RunnerOf(coordinator) = %q, %v", id, err)
	}
	rc, errs := connectAs(t, ns.ClientURL(), rcreds, nats.CustomInboxPrefix(RunnerInboxPrefix("r1")))
	rjs, err := jetstream.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	pulls, err := jetstream.NewWithAPIPrefix(rc, proto.PullPrefix("r1"))
	if err != nil {
		t.Fatal(err)
	}

	// What a runner does.
	cons, err := pulls.Consumer(ctx, proto.WorkStream, work)
	if err != nil {
		t.Fatalf("the runner cannot bind to its work consumer: %v", err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil || string(msg.Data()) != "job" {
		t.Fatalf("the runner cannot pull work: %v", err)
	}
	if err := msg.DoubleAck(ctx); err != nil {
		t.Fatalf("the runner cannot ack work: %v", err)
	}
	if _, err := rjs.Publish(ctx, proto.StateSubject("r1", "j1"), []byte("{}")); err != nil {
		t.Fatalf("the runner cannot publish its events: %v", err)
	}
	if err := rc.Publish(proto.HeartbeatSubject("r1", "default"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-heard:
		if s != proto.HeartbeatSubject("r1", "default") {
			t.Fatalf("heard %s", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the runner's heartbeat did not arrive")
	}

	// It answers control requests and micro discovery: replies to requests it got are allowed.
	svc, err := micro.AddService(rc, micro.Config{Name: proto.ServiceName, Version: "1.0.0", Endpoint: &micro.EndpointConfig{
		Subject: proto.ControlSubject("r1"), Handler: micro.HandlerFunc(func(req micro.Request) { _ = req.Respond([]byte("ok")) }),
	}})
	if err != nil {
		t.Fatalf("the runner cannot register its service: %v", err)
	}
	defer svc.Stop()
	if err := rc.Flush(); err != nil { // the server has the service's subscriptions
		t.Fatal(err)
	}
	if m, err := coord.Request(proto.ControlSubject("r1"), []byte("ping"), 5*time.Second); err != nil || string(m.Data) != "ok" {
		t.Fatalf("control request: %v", err)
	}
	if _, err := coord.Request("$SRV.PING."+proto.ServiceName, nil, 5*time.Second); err != nil {
		t.Fatalf("micro ping: %v", err)
	}
	// It asks the coordinator to confirm the start of expired work, and gets the answer.
	confirm, err := coord.Subscribe(proto.ConfirmSubjects, func(m *nats.Msg) { _ = m.Respond([]byte("ok")) })
	if err != nil {
		t.Fatal(err)
	}
	defer confirm.Unsubscribe()
	if err := coord.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := rc.Request(proto.ConfirmSubject("r1"), []byte("j1"), 5*time.Second); err != nil || string(m.Data) != "ok" {
		t.Fatalf("confirmation request: %v", err)
	}

	// What it must not do.
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		t.Cleanup(cancel)
		return c
	}
	if _, err := rjs.Publish(short(), proto.WorkSubject("default", proto.CapPlain), []byte("rm -rf /")); err == nil {
		t.Fatal("the runner queued work")
	}
	wantViolation(t, errs, proto.WorkSubject("default", proto.CapPlain))
	if _, err := rjs.Publish(short(), proto.StateSubject("r2", "j1"), []byte("{}")); err == nil {
		t.Fatal("the runner published another runner's event")
	}
	wantViolation(t, errs, proto.StateSubject("r2", "j1"))
	// Nor heartbeat as another runner, or for a pool its creds do not name: the coordinator makes
	// work consumers for the pools heartbeats name. Nor write a job's output where the coordinator
	// keeps it.
	for _, subject := range []string{proto.HeartbeatSubject("r2", "default"), proto.HeartbeatSubject("r1", "other"),
		proto.JobOutputSubject("j1"), proto.OutputIngest("k3y", "j1")} {
		if err := rc.Publish(subject, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		wantViolation(t, errs, subject)
	}
	// Nor send JetStream a request of its own, whose reply could aim a delivery of work at a stream,
	// nor pull as another runner (whose inbox the coordinator would deliver to).
	for _, subject := range []string{
		"$JS.API.CONSUMER.MSG.NEXT." + proto.WorkStream + "." + work, "$JS.API.CONSUMER.INFO." + proto.WorkStream + "." + work,
		proto.PullPrefix("r2") + ".CONSUMER.MSG.NEXT." + proto.WorkStream + "." + work, proto.ConfirmSubject("r2"),
	} {
		if err := rc.PublishRequest(subject, proto.EventSubjects[:len(proto.EventSubjects)-1]+"r1.j1.state", []byte(`{"batch":1}`)); err != nil {
			t.Fatal(err)
		}
		wantViolation(t, errs, subject)
	}
	for _, subject := range []string{proto.WorkSubjects, proto.EventSubjects, proto.ControlSubject("r2"), "_INBOX.>", RunnerInboxPrefix("r2") + ".>"} {
		if _, err := rc.SubscribeSync(subject); err != nil {
			t.Fatal(err)
		}
		wantViolation(t, errs, subject)
	}
	if _, err := pulls.Consumer(short(), proto.WorkStream, other); err == nil {
		t.Fatal("a runner of pool default bound to pool other's work consumer")
	}
	if err := rjs.DeleteConsumer(short(), proto.WorkStream, work); err == nil {
		t.Fatal("the runner deleted the work consumer")
	}
	if err := rjs.DeleteStream(short(), proto.EventStream); err == nil {
		t.Fatal("the runner deleted the event stream")
	}
	if _, err := rjs.CreateOrUpdateConsumer(short(), proto.WorkStream, jetstream.ConsumerConfig{Durable: "mine", FilterSubject: proto.WorkSubjects}); err == nil {
		t.Fatal("the runner created a consumer")
	}
	if _, err := cjs.Consumer(ctx, proto.WorkStream, work); err != nil {
		t.Fatalf("the work consumer is gone: %v", err)
	}
	if _, err := cjs.Stream(ctx, proto.EventStream); err != nil {
		t.Fatalf("the event stream is gone: %v", err)
	}
}

// TestServerConfig: the include `sbx auth init` writes starts a server in operator mode that takes
// the authority's users and refuses anonymous ones.
func TestServerConfig(t *testing.T) {
	dir := t.TempDir()
	a, err := Open(filepath.Join(dir, "auth"))
	if err != nil {
		t.Fatal(err)
	}
	conf, err := a.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteSecret(filepath.Join(dir, ServerConfigFile), conf); err != nil {
		t.Fatal(err)
	}
	ns := runConfig(t, dir, "listen: 127.0.0.1:-1\njetstream { store_dir: "+filepath.Join(dir, "js")+" }\ninclude "+ServerConfigFile+"\n")
	if nc, err := nats.Connect(ns.ClientURL()); err == nil {
		nc.Close()
		t.Fatal("an anonymous client connected")
	}
	creds, err := a.CoordinatorCreds()
	if err != nil {
		t.Fatal(err)
	}
	nc, _ := connectAs(t, ns.ClientURL(), creds)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: proto.EventStream, Subjects: []string{proto.EventSubjects}}); err != nil {
		t.Fatalf("JetStream is not enabled for the sbx account: %v", err)
	}
}

// TestExpiryAndRevocation: runner creds with a lifetime stop working when it ends; a revoked
// runner's creds, and an old coordinator's after a rotation, are refused once the NATS server
// reloaded the nats-auth.conf that revoking rewrote, while the others' still work. Before, creds
// never expired and could not be revoked.
func TestExpiryAndRevocation(t *testing.T) {
	dir := t.TempDir()
	a, err := Open(filepath.Join(dir, "auth"))
	if err != nil {
		t.Fatal(err)
	}
	writeConf := func() {
		t.Helper()
		conf, err := a.ServerConfig()
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteSecret(filepath.Join(dir, "auth", ServerConfigFile), conf); err != nil {
			t.Fatal(err)
		}
	}
	writeConf()
	ns := runConfig(t, dir, "listen: 127.0.0.1:-1\ninclude auth/"+ServerConfigFile+"\n")
	connects := func(creds []byte) bool {
		t.Helper()
		path := filepath.Join(t.TempDir(), "user.creds")
		if err := WriteSecret(path, creds); err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(ns.ClientURL(), nats.UserCredentials(path), nats.NoReconnect(),
			nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			return false
		}
		defer nc.Close()
		return nc.Flush() == nil
	}
	mint := func(id string, ttl time.Duration) []byte {
		t.Helper()
		creds, err := a.RunnerCreds(id, "", ttl)
		if err != nil {
			t.Fatal(err)
		}
		return creds
	}

	short, victim, bystander := mint("short", 2*time.Second), mint("victim", 0), mint("bystander", time.Hour)
	oldCoord, err := a.CoordinatorCreds()
	if err != nil {
		t.Fatal(err)
	}
	for name, creds := range map[string][]byte{"short": short, "victim": victim, "bystander": bystander, "coordinator": oldCoord} {
		if !connects(creds) {
			t.Fatalf("%s's fresh creds are refused", name)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); connects(short); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("creds of a 2 s lifetime still work after 10 s")
		}
	}

	pub, err := a.RunnerPublicKey("victim")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := UserOf(victim); err != nil || got != pub {
		t.Fatalf("victim's creds are of user %s (%v), want %s", got, err, pub)
	}
	oldPub, err := UserOf(oldCoord)
	if err != nil {
		t.Fatal(err)
	}
	newCoord, err := a.CoordinatorCreds()
	if err != nil {
		t.Fatal(err)
	}
	revokedAt := time.Now()
	for _, p := range []string{pub, oldPub} {
		if err := a.Revoke(p, revokedAt); err != nil {
			t.Fatal(err)
		}
	}
	writeConf()
	if err := ns.Reload(); err != nil {
		t.Fatal(err)
	}
	for name, creds := range map[string][]byte{"victim": victim, "old coordinator": oldCoord} {
		if connects(creds) {
			t.Errorf("%s's revoked creds still connect", name)
		}
	}
	for name, creds := range map[string][]byte{"bystander": bystander, "new coordinator": newCoord} {
		if !connects(creds) {
			t.Errorf("%s's creds are refused", name)
		}
	}
	// Creds minted for the runner after the revocation work again (the list holds a time).
	for time.Now().Unix() <= revokedAt.Unix() {
		time.Sleep(50 * time.Millisecond)
	}
	if !connects(mint("victim", 0)) {
		t.Error("creds minted after the revocation are refused")
	}
}

// TestLeasePermissions: the coordinator's user can make the leader lease's bucket and lead; a
// runner's cannot write the lease.
func TestLeasePermissions(t *testing.T) {
	ns, a, _ := startServer(t)
	ccreds, err := a.CoordinatorCreds()
	if err != nil {
		t.Fatal(err)
	}
	coord, _ := connectAs(t, ns.ClientURL(), ccreds)
	lease, err := natsbus.OpenLease(t.Context(), coord, natsbus.LeaseConfig{ID: "c1", TTL: 400 * time.Millisecond})
	if err != nil {
		t.Fatalf("the coordinator cannot open the lease: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	led := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- lease.Run(ctx, func(ctx context.Context) error { close(led); <-ctx.Done(); return nil })
	}()
	select {
	case <-led:
	case err := <-done:
		t.Fatalf("the coordinator cannot lead: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the coordinator does not lead within 5s")
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v", err)
	}

	rcreds, err := a.RunnerCreds("r1", "default", 0)
	if err != nil {
		t.Fatal(err)
	}
	runner, errs := connectAs(t, ns.ClientURL(), rcreds)
	subject := "$KV." + natsbus.LeaseBucket + ".leader"
	if err := runner.Publish(subject, []byte(`{"id":"r1"}`)); err != nil {
		t.Fatal(err)
	}
	wantViolation(t, errs, subject)
}

// runConfig writes conf as dir/nats.conf, as an operator would, and runs a server from that file
// until t ends.
func runConfig(t *testing.T, dir, conf string) *server.Server {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "nats.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	return natstest.Run(t, opts)
}
