package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestLayers keeps the arrows of DESIGN.md pointing one way: nothing under coordinator/ imports the
// runner or the sandbox, the runner never imports the coordinator, proto and coordinator/api import
// only the standard library, the Go client imports nothing of the coordinator but the API's wire
// types, and the coordinator's domain package imports no adapter and no technology.
func TestLayers(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go tool")
	}
	const mod = "github.com/sbx-dev/sbx/"
	out, err := exec.Command("go", "list", "-deps=false", "-f", "{{.ImportPath}} {{join .Deps \" \"}}", mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	rules := []struct {
		pkg       string // prefix of the packages the rule holds for
		forbidden []string
		allowed   []string // under forbidden, yet allowed
	}{
		{mod + "coordinator", []string{mod + "runner", mod + "sandbox"}, nil},
		{mod + "runner", []string{mod + "coordinator"}, nil},
		{mod + "coordinator/httpapi", []string{mod + "coordinator/store", mod + "coordinator/natsbus", mod + "coordinator/client", mod + "coordinator/natsauth"}, nil},
		{mod + "coordinator/store", []string{mod + "coordinator/httpapi", mod + "coordinator/natsbus", mod + "coordinator/client", mod + "coordinator/api", mod + "coordinator/natsauth"}, nil},
		{mod + "coordinator/natsbus", []string{mod + "coordinator/httpapi", mod + "coordinator/store", mod + "coordinator/client", mod + "coordinator/api", mod + "coordinator/natsauth"}, nil},
		// The NATS authority mints credentials from proto's subjects alone.
		{mod + "coordinator/natsauth", []string{mod + "coordinator/httpapi", mod + "coordinator/store", mod + "coordinator/natsbus", mod + "coordinator/client", mod + "coordinator/api"}, nil},
		{mod + "coordinator/client", []string{mod + "coordinator"}, []string{mod + "coordinator/api"}},
		// The MCP server calls the API through its Go client alone, in-process or over HTTP.
		{mod + "coordinator/mcp", []string{mod + "coordinator", mod + "proto"}, []string{mod + "coordinator/client", mod + "coordinator/api"}},
		{mod + "sandbox", []string{mod + "coordinator", mod + "runner", "github.com/nats-io/", "net/http"}, nil},
		// What internal/ holds for several packages (test helpers, jsready) imports no sbx package,
		// so that sharing it draws no arrow between them.
		{mod + "internal", []string{mod + "cmd", mod + "coordinator", mod + "proto", mod + "runner", mod + "sandbox"}, nil},
	}
	exact := map[string][]string{
		// The domain: stdlib and proto only.
		mod + "coordinator": {"github.com/", "go.etcd.io/", "golang.org/x/"},
	}
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		pkg, deps := fields[0], fields[1:]
		for _, dep := range deps {
			for _, r := range rules {
				if pkg != r.pkg && !strings.HasPrefix(pkg, r.pkg+"/") {
					continue
				}
				for _, f := range r.forbidden {
					if under(dep, f) && !under(dep, pkg) && !slices.ContainsFunc(r.allowed, func(a string) bool { return under(dep, a) }) {
						t.Errorf("%s imports %s", pkg, dep)
					}
				}
			}
			for _, f := range exact[pkg] {
				if strings.HasPrefix(dep, f) && !strings.HasPrefix(dep, mod+"proto") {
					t.Errorf("the domain package %s imports %s", pkg, dep)
				}
			}
			if (pkg == mod+"proto" || pkg == mod+"coordinator/api") && strings.Contains(strings.SplitN(dep, "/", 2)[0], ".") {
				t.Errorf("%s imports %s: it must use the standard library only", pkg, dep)
			}
		}
		checked++
	}
	if checked < 12 {
		t.Fatalf("checked only %d packages", checked)
	}
}

// under reports whether pkg is path or below it.
func under(pkg, path string) bool {
	path = strings.TrimSuffix(path, "/")
	return pkg == path || strings.HasPrefix(pkg, path+"/")
}
