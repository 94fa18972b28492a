package coordinator_test

import (
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"slices"
	"testing"
)

const protoPath = "github.com/sbx-dev/sbx/proto"

// TestAPINamesNoWireType: no exported identifier of the domain mentions a type of proto (an
// exported function, method, struct field, interface method or alias), so that a new wire version
// changes coordinator/natsbus, which translates, and not the domain's signatures. The domain may
// use proto's constants, bounds and validators inside its code: they are vocabulary it shares with
// the runners.
func TestAPINamesNoWireType(t *testing.T) {
	bp, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	pkg, _ := typeCheck(t, "github.com/sbx-dev/sbx/coordinator", bp.Dir, bp.GoFiles, nil, nil)
	for _, found := range wireTypesIn(pkg) {
		t.Errorf("the domain's API mentions a proto type: %s", found)
	}
}

// TestAPINamesNoWireTypeCatches: the check above finds a proto type wherever the API can show one.
func TestAPINamesNoWireTypeCatches(t *testing.T) {
	src := `package x

import (
	"context"

	"github.com/sbx-dev/sbx/proto"
)

type Limits = proto.Limits

type Job struct {
	Ports []*proto.Port
	work  proto.Work // unexported: not API
}

type Dispatcher interface {
	Control(ctx context.Context, c *proto.Control) error
}

type Service struct{}

func (*Service) HandleEvent(e map[string]proto.Event) {}

func (*Service) handle(e proto.Event) {} // unexported: not API

type hidden struct{ Size proto.TTYSize }

func Size() hidden { return hidden{} }

func Bound() int { return proto.MaxCommandBytes } // a constant used inside: allowed
`
	// In this directory, so that proto is imported from this module.
	pkg, _ := typeCheck(t, "x", ".", nil, map[string]string{"x.go": src}, nil)
	got := wireTypesIn(pkg)
	want := []string{"Dispatcher", "Job.Ports", "Limits", "Service.HandleEvent", "Size"}
	if !slices.Equal(got, want) {
		t.Fatalf("found %q, want %q", got, want)
	}
}

// typeCheck type-checks a package of files (under dir) or of sources (name → text), importing
// from source; it fills info when given, and returns the files parsed too.
func typeCheck(t *testing.T, path, dir string, files []string, sources map[string]string, info *types.Info) (*types.Package, []*ast.File) {
	t.Helper()
	fset := token.NewFileSet()
	var parsed []*ast.File
	for _, name := range files {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, f)
	}
	for name, src := range sources {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), src, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, f)
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	pkg, err := conf.Check(path, fset, parsed, info)
	if err != nil {
		t.Fatal(err)
	}
	return pkg, parsed
}

// wireTypesIn lists, sorted, the exported identifiers of pkg (Type.Member for a field or method)
// whose declared type mentions a type of proto.
func wireTypesIn(pkg *types.Package) []string {
	var found []string
	report := func(name string, t types.Type) {
		if mentionsWire(t, pkg, map[types.Type]bool{}) {
			found = append(found, name)
		}
	}
	for _, name := range pkg.Scope().Names() {
		obj := pkg.Scope().Lookup(name)
		if !obj.Exported() {
			continue
		}
		tn, ok := obj.(*types.TypeName)
		if !ok {
			report(name, obj.Type())
			continue
		}
		if tn.IsAlias() {
			report(name, obj.Type())
			continue
		}
		named := obj.Type().(*types.Named)
		switch u := named.Underlying().(type) {
		case *types.Struct:
			for f := range u.Fields() {
				if f.Exported() {
					report(name+"."+f.Name(), f.Type())
				}
			}
		default:
			report(name, u)
		}
		for m := range named.Methods() {
			if m.Exported() {
				report(name+"."+m.Name(), m.Type())
			}
		}
	}
	slices.Sort(found)
	return slices.Compact(found)
}

// mentionsWire reports whether t names a proto type, itself or through what it is made of: an
// unexported type of pkg is looked into, as the API shows its fields; an exported one is checked
// on its own.
func mentionsWire(t types.Type, pkg *types.Package, seen map[types.Type]bool) bool {
	if seen[t] {
		return false
	}
	seen[t] = true
	switch t := t.(type) {
	case *types.Alias:
		return mentionsWire(types.Unalias(t), pkg, seen)
	case *types.Named:
		obj := t.Obj()
		if obj.Pkg() != nil && obj.Pkg().Path() == protoPath {
			return true
		}
		for a := range t.TypeArgs().Types() {
			if mentionsWire(a, pkg, seen) {
				return true
			}
		}
		if obj.Pkg() == pkg && !obj.Exported() {
			return mentionsWire(t.Underlying(), pkg, seen)
		}
		return false
	case *types.Pointer:
		return mentionsWire(t.Elem(), pkg, seen)
	case *types.Slice:
		return mentionsWire(t.Elem(), pkg, seen)
	case *types.Array:
		return mentionsWire(t.Elem(), pkg, seen)
	case *types.Chan:
		return mentionsWire(t.Elem(), pkg, seen)
	case *types.Map:
		return mentionsWire(t.Key(), pkg, seen) || mentionsWire(t.Elem(), pkg, seen)
	case *types.Signature:
		return mentionsWire(t.Params(), pkg, seen) || mentionsWire(t.Results(), pkg, seen)
	case *types.Tuple:
		for v := range t.Variables() {
			if mentionsWire(v.Type(), pkg, seen) {
				return true
			}
		}
	case *types.Struct:
		for f := range t.Fields() {
			if f.Exported() && mentionsWire(f.Type(), pkg, seen) {
				return true
			}
		}
	case *types.Interface:
		for m := range t.Methods() {
			if mentionsWire(m.Type(), pkg, seen) {
				return true
			}
		}
	}
	return false
}
