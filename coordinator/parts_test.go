package coordinator_test

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/types"
	"slices"
	"testing"
)

// lockOrder is the coordinator's parts in their lock order (service.go): a part may call only
// parts after it. The front, Service, comes before every part and no part may call it.
var lockOrder = []string{"lifecycle", "fleet", "sessionBook", "retention"}

// TestPartsCallForward: no method of a part uses a method or field of a part before it in the lock
// order, or of the front. A part takes its own lock in its methods, so a call backwards could take
// a lock above one held: the order would no longer exclude a deadlock.
func TestPartsCallForward(t *testing.T) {
	bp, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, found := range backwardCalls(t, "github.com/sbx-dev/sbx/coordinator", bp.Dir, bp.GoFiles, nil) {
		t.Errorf("a part calls backwards in the lock order: %s", found)
	}
}

// TestPartsCallForwardCatches: the check above finds a call backwards, to the front, and inside a
// closure; it lets a call forward and a part's own calls be.
func TestPartsCallForwardCatches(t *testing.T) {
	src := `package x

type Service struct{ jobs *lifecycle }

func (s *Service) Start() { s.jobs.add() }

type lifecycle struct {
	fleet *fleet
	front *Service
}

func (lc *lifecycle) add()   { lc.fleet.stop(); lc.own() }
func (lc *lifecycle) own()   {}
func (lc *lifecycle) bad()   { lc.front.Start() }

type fleet struct {
	jobs     *lifecycle
	sessions *sessionBook
}

func (f *fleet) stop()  { go func() { f.jobs.own() }() }
func (f *fleet) ok()    { f.sessions.deliver() }

type sessionBook struct{ fleet *fleet }

func (b *sessionBook) deliver() { _ = b.fleet.jobs }

type retention struct{}
`
	got := backwardCalls(t, "x", ".", nil, map[string]string{"x.go": src})
	want := []string{"fleet.stop → lifecycle.own", "lifecycle.bad → Service.Start", "sessionBook.deliver → fleet.jobs"}
	if !slices.Equal(got, want) {
		t.Fatalf("found %q, want %q", got, want)
	}
}

// backwardCalls type-checks a package (files under dir, or sources) and lists, sorted, each use in
// a part's method of a method or field of a part before it in lockOrder or of Service, as
// "part.method → other.name".
func backwardCalls(t *testing.T, path, dir string, files []string, sources map[string]string) []string {
	t.Helper()
	info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}, Defs: map[*ast.Ident]types.Object{}}
	_, parsed := typeCheck(t, path, dir, files, sources, info)
	var found []string
	for _, f := range parsed {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || fn.Body == nil {
				continue
			}
			part := recvName(info.Defs[fn.Name].Type().(*types.Signature).Recv().Type())
			rank := slices.Index(lockOrder, part)
			if rank < 0 {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				se, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				sel, ok := info.Selections[se]
				if !ok {
					return true
				}
				other := recvName(sel.Recv())
				if r := slices.Index(lockOrder, other); other == "Service" || r >= 0 && r < rank {
					found = append(found, fmt.Sprintf("%s.%s → %s.%s", part, fn.Name.Name, other, se.Sel.Name))
				}
				return true
			})
		}
	}
	slices.Sort(found)
	return slices.Compact(found)
}

// recvName is the name of the named type t is, or points to ("" for another type).
func recvName(t types.Type) string {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	if n, ok := types.Unalias(t).(*types.Named); ok {
		return n.Obj().Name()
	}
	return ""
}
