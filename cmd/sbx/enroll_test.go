package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbx-dev/sbx/coordinator/natsauth"
)

// TestShortSecretsRefused: a token file or enroll key under 16 bytes stops the start with a message
// naming the file. Before, one byte was accepted.
func TestShortSecretsRefused(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	accountKey := filepath.Join(dir, "auth", natsauth.AccountSeedFile)
	if _, err := natsauth.Open(filepath.Join(dir, "auth")); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"token":      {"coordinator", "--nats", "nats://127.0.0.1:1", "--token-file", short},
		"enroll key": {"coordinator", "--nats", "nats://127.0.0.1:1", "--enroll-key", short, "--nats-account-key", accountKey},
	} {
		t.Run(name, func(t *testing.T) {
			// A start that took the secret would wait for NATS: the deadline makes that a failure.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			err := run(ctx, append(args, "--data", t.TempDir()), func(string) string { return "" }, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), short) || !strings.Contains(err.Error(), "at least 16") {
				t.Fatalf("a 1-byte secret: %v, want refused naming the file", err)
			}
		})
	}
}
