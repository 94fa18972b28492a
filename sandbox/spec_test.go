package sandbox

import (
	"cmp"
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
	for _, procs := range [][]string{nil, {"/a/cgroup.procs", "/b/cgroup.procs"}} {
		args := initArgs(procs)
		if args[0] != initArg0 {
			t.Fatalf("argv[0] = %q", args[0])
		}
		got, err := parseInitArgs(args[1:])
		if err != nil || strings.Join(got, "|") != strings.Join(procs, "|") {
			t.Errorf("parseInitArgs(%q) = %q, %v", args[1:], got, err)
		}
	}
	for _, bad := range [][]string{{"1"}, {"x"}, {}, {"0", "extra"}} {
		if _, err := parseInitArgs(bad); err == nil {
			t.Errorf("parseInitArgs accepted %q", bad)
		}
	}
}

func TestJobMessageRoundTrip(t *testing.T) {
	tests := []struct {
		name     string
		spec     Spec
		readonly bool
	}{
		{"plain", Spec{Path: "/bin/sh", Args: []string{"sh", "-c", "echo 1 2"}, Dir: "/tmp", Env: []string{"A=1", "B="}}, false},
		{"no args", Spec{Path: "/bin/true", Env: []string{}}, false},
		{"user", Spec{Path: "/bin/id", Args: []string{"id"}, Credential: &Credential{UID: 65534, GID: 65534, Groups: []uint32{4, 27, 4294967294}}}, true},
		{"tty", Spec{Path: "/bin/sh", TTY: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, err := parseJobMessage(jobMessage(tt.spec, tt.readonly))
			if err != nil {
				t.Fatal(err)
			}
			args := tt.spec.Args
			if len(args) == 0 {
				args = []string{tt.spec.Path}
			}
			dir := cmp.Or(tt.spec.Dir, "/")
			if j.readonly != tt.readonly || j.tty != tt.spec.TTY || j.cred.String() != tt.spec.Credential.String() || j.dir != dir || j.path != tt.spec.Path ||
				strings.Join(j.argv, "|") != strings.Join(args, "|") || strings.Join(j.env, "|") != strings.Join(tt.spec.Env, "|") {
				t.Errorf("got %+v", j)
			}
		})
	}
	for _, bad := range []string{"", "0\x000\x00-\x00/\x00/bin/true\x001\x00true\x00", "0\x000\x00-\x00/\x00/bin/true\x005\x00true\x000\x00",
		"0\x000\x001:x:\x00/\x00/bin/true\x000\x000\x00", "0\x00-\x00/\x00/bin/true\x000\x000\x00"} {
		if _, err := parseJobMessage([]byte(bad)); err == nil {
			t.Errorf("parseJobMessage accepted %q", bad)
		}
	}
}
