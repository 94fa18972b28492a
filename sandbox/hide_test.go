package sandbox

import (
	"os"
	"path/filepath"
	"testing"
)

// TestFindHiddenUnreachable: a hidden path inside a directory the job's user cannot search is left
// out (the job cannot reach it, and bwrap running as that user could not mount over it); for the
// runner's own user, and for a user that can search the way, it is covered.
func TestFindHiddenUnreachable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to own a directory another user cannot search")
	}
	private := filepath.Join(t.TempDir(), "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(private, "secret")
	if err := os.WriteFile(secret, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// t.TempDir's own directories are 0700 too: open the way up to private.
	for d := filepath.Dir(private); d != "/"; d = filepath.Dir(d) {
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
	nobody := &Credential{UID: 65534, GID: 65534}
	tests := []struct {
		name string
		cred *Credential
		want int
	}{
		{"runner's own user", nil, 1},
		{"root", &Credential{UID: 0, GID: 0}, 1},
		{"nobody", nobody, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hs, err := findHidden([]string{secret}, tt.cred)
			if err != nil || len(hs) != tt.want {
				t.Fatalf("findHidden = %+v, %v; want %d paths", hs, err, tt.want)
			}
		})
	}
	if err := os.Chmod(private, 0o701); err != nil {
		t.Fatal(err)
	}
	if hs, err := findHidden([]string{secret}, nobody); err != nil || len(hs) != 1 {
		t.Fatalf("once nobody can search the way: %+v, %v; want the path covered", hs, err)
	}
}
