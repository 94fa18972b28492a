package sandbox

import (
	"errors"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestSpecValidate(t *testing.T) {
	limit := int64(64 << 20)
	tests := []struct {
		name string
		spec Spec
		want error
	}{
		{"ok", Spec{ID: "job-1_A", Path: "/bin/true"}, nil},
		{"ok with limits", Spec{ID: "j", Path: "/bin/true", Resources: &specs.LinuxResources{
			Memory: &specs.LinuxMemory{Limit: &limit}, Pids: &specs.LinuxPids{Limit: &limit}}}, nil},
		{"empty id", Spec{Path: "/bin/true"}, ErrInvalidSpec},
		{"id with slash", Spec{ID: "a/b", Path: "/bin/true"}, ErrInvalidSpec},
		{"id dotdot", Spec{ID: "..", Path: "/bin/true"}, ErrInvalidSpec},
		{"id with space", Spec{ID: "a b", Path: "/bin/true"}, ErrInvalidSpec},
		{"id too long", Spec{ID: strings.Repeat("a", 65), Path: "/bin/true"}, ErrInvalidSpec},
		{"relative path", Spec{ID: "j", Path: "bin/true"}, ErrInvalidSpec},
		{"empty path", Spec{ID: "j"}, ErrInvalidSpec},
		{"relative dir", Spec{ID: "j", Path: "/bin/true", Dir: "tmp"}, ErrInvalidSpec},
		{"devices", Spec{ID: "j", Path: "/bin/true", Resources: &specs.LinuxResources{
			Devices: []specs.LinuxDeviceCgroup{{Allow: true}}}}, ErrUnsupported},
		{"cpuset", Spec{ID: "j", Path: "/bin/true", Resources: &specs.LinuxResources{
			CPU: &specs.LinuxCPU{Cpus: "0"}}}, ErrUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.spec.validate()
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("validate() = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestNewManagerInvalidConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"empty root", Config{}},
		{"absolute root", Config{Root: "/sbx"}},
		{"dotdot root", Config{Root: "sbx/../x"}},
		{"unclean root", Config{Root: "sbx//x"}},
		{"dot root", Config{Root: "."}},
		{"bad version", Config{Root: "sbx", Version: "v3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewManager(tt.cfg); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("NewManager() = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestInitArgsRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		cred  *Credential
		procs []string
		path  string
		argv  []string
	}{
		{"none", nil, nil, "/bin/true", []string{"true"}},
		{"two", nil, []string{"/a/cgroup.procs", "/b/cgroup.procs"}, "/bin/sh", []string{"sh", "-c", "echo 1 2"}},
		{"user", &Credential{UID: 1000, GID: 100}, []string{"/a/cgroup.procs"}, "/bin/sh", []string{"sh"}},
		{"groups", &Credential{UID: 65534, GID: 65534, Groups: []uint32{4, 27, 4294967294}}, nil, "/bin/id", []string{"id"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := initArgs(tt.cred, tt.procs, tt.path, tt.argv)
			if args[0] != initArg0 {
				t.Fatalf("argv[0] = %q", args[0])
			}
			cred, procs, path, argv, err := parseInitArgs(args[1:])
			if err != nil {
				t.Fatal(err)
			}
			if cred.String() != tt.cred.String() {
				t.Errorf("credential %s, want %s", cred, tt.cred)
			}
			if strings.Join(procs, "|") != strings.Join(tt.procs, "|") || path != tt.path ||
				strings.Join(argv, "|") != strings.Join(tt.argv, "|") {
				t.Errorf("got %q %q %q", procs, path, argv)
			}
		})
	}
	for _, bad := range [][]string{{"-", "5", "x"}, {"5"}, {"1:2", "0", "/bin/true", "true"}, {"1:x:", "0", "/bin/true", "true"}, {"1:2:3,", "0", "/bin/true", "true"}} {
		if _, _, _, _, err := parseInitArgs(bad); err == nil {
			t.Errorf("parseInitArgs accepted %q", bad)
		}
	}
}
