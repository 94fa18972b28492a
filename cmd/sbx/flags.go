package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// newFlags returns a flag set that reports errors instead of exiting.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sbx "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parse parses flags, turning a mistake into a usage error.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return &exitError{code: 0}
		}
		return &exitError{code: 2}
	}
	return nil
}

// parseArgs parses flags that may come before or after the positional arguments; everything after
// "--" is positional.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for len(args) > 0 {
		if err := parse(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			break
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
	return pos, nil
}

// stringList collects a repeated flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// parseBytes reads sizes like 512M, 1G, 64MiB, 1000000.
func parseBytes(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1}}
	mult := int64(1)
	num := s
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || f*float64(mult) > 1<<50 {
		return 0, fmt.Errorf("%q is not a size like 512M", s)
	}
	return int64(f * float64(mult)), nil
}

// checkMaxBlock checks the value of a flag that bounds how long a tool call blocks.
func checkMaxBlock(flag string, d time.Duration) error {
	if d < time.Second || d > 10*time.Minute {
		return usageError("%s must be between 1s and 10m", flag)
	}
	return nil
}

// maxLabels bounds a runner's labels, which every heartbeat carries.
const maxLabels = 32

// parseLabels turns --label KEY=VALUE flags into a map. A key is 1–63 characters of letters, digits
// and "._-/"; a value at most 256 bytes.
func parseLabels(flags []string) (map[string]string, error) {
	if len(flags) == 0 {
		return nil, nil
	}
	if len(flags) > maxLabels {
		return nil, usageError("--label: at most %d labels", maxLabels)
	}
	labels := make(map[string]string, len(flags))
	for _, f := range flags {
		k, v, ok := strings.Cut(f, "=")
		if !ok || !validLabelKey(k) || len(v) > 256 {
			return nil, usageError("--label %q must be KEY=VALUE, KEY 1-63 characters of letters, digits and ._-/, VALUE at most 256 bytes", f)
		}
		if _, dup := labels[k]; dup {
			return nil, usageError("--label %s is given twice", k)
		}
		labels[k] = v
	}
	return labels, nil
}

func validLabelKey(k string) bool {
	if len(k) == 0 || len(k) > 63 {
		return false
	}
	for _, c := range k {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._-/", c)) {
			return false
		}
	}
	return true
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("port %q is not a number", p)
	}
	return host, port, nil
}

func defaultDataDir(getenv func(string) string) string {
	if os.Geteuid() == 0 {
		return "/var/lib/sbx"
	}
	if d := getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "sbx")
	}
	return filepath.Join(getenv("HOME"), ".local", "state", "sbx")
}
