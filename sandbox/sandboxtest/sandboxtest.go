// Package sandboxtest holds what the tests of sandbox and of the packages that run readonly jobs
// through it (cmd/sbx) share: the C probe of the readonly sandbox, and a shared mount to propagate
// from.
package sandboxtest

import (
	_ "embed"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// probeSource is testdata/probe.c: one call a readonly job must not (or must still) be able to
// make, reported as "ok" or "errno N"; its head comment says more.
//
//go:embed testdata/probe.c
var probeSource []byte

// Probe compiles the probe with gcc into a directory of t's, which a readonly job can read, and
// returns the binary's path. It skips t where gcc is missing.
func Probe(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed: the probe is a C program")
	}
	dir := t.TempDir()
	src, bin := filepath.Join(dir, "probe.c"), filepath.Join(dir, "probe")
	if err := os.WriteFile(src, probeSource, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin
}

// SharedMount makes a directory of t's a shared mount (bound on itself, then made shared; this
// machine's / may well be private) with an empty subdirectory, and returns both. A mount made on the
// subdirectory then propagates to every peer and slave. It skips t where it cannot mount, and
// unmounts at the end of t.
func SharedMount(t testing.TB) (dir, sub string) {
	t.Helper()
	dir = t.TempDir()
	sub = filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Skipf("bind mount: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		t.Fatalf("make shared: %v", err)
	}
	return dir, sub
}
