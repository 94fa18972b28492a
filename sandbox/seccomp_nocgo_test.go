//go:build !cgo || !linux

package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestReadonlyWithoutCgo: a build without libseccomp refuses readonly jobs (fail closed).
func TestReadonlyWithoutCgo(t *testing.T) {
	eachVersion(t, func(t *testing.T, cfg Config) {
		cfg.Bwrap = "/bin/true" // found, so that the missing filter is what fails
		m, _ := newTestManager(t, cfg)
		marker := filepath.Join(t.TempDir(), "ran")
		spec := sh("ro-nocgo", "touch "+marker)
		spec.Readonly = true
		if _, err := m.Start(spec); !errors.Is(err, ErrNoSeccomp) {
			t.Fatalf("Start = %v, want ErrNoSeccomp", err)
		}
		if err := m.ProbeReadonly(t.Context()); !errors.Is(err, ErrNoSeccomp) {
			t.Fatalf("ProbeReadonly = %v, want ErrNoSeccomp", err)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("a readonly command ran")
		}
	})
}
