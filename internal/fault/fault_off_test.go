//go:build !chaos

package fault

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A normal build pays nothing for the fault points: the functions are empty and inlinable (so
// a call to them compiles to nothing), and no call is even compiled, because every call site in
// the module sits in a block guarded by the constant fault.Enabled (false here), which the
// compiler removes with everything in it.
func TestPointsCostNothingInANormalBuild(t *testing.T) {
	if Enabled {
		t.Fatal("Enabled in a build without the chaos tag")
	}
	if n := testing.AllocsPerRun(100, func() { _ = PointFor(BeforeOutcome, "x"); _ = Point(Heartbeat) }); n != 0 {
		t.Fatalf("a point allocates %v times", n)
	}

	// Every call site is guarded, and every named point is placed somewhere.
	root := filepath.Join("..", "..")
	used := map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name == "contrib" || name == "tools" || strings.HasPrefix(name, ".") && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || filepath.Dir(path) == "." {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		checkGuarded(t, fset, f, used)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range Names() {
		if !used[name] {
			t.Errorf("fault point %q is not placed anywhere", name)
		}
	}

	// The compiler's own word that the empty functions inline (a call left unguarded would
	// compile to nothing, too).
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool on PATH: %v", err)
	}
	out, err := exec.Command(goTool, "build", "-gcflags=-m", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build -gcflags=-m: %v\n%s", err, out)
	}
	for _, fn := range []string{"Point", "PointFor"} {
		if !regexp.MustCompile(`(?m)fault_off\.go:\d+:\d+: can inline ` + fn + `$`).Match(out) {
			t.Errorf("the compiler does not inline %s:\n%s", fn, out)
		}
	}
}

// checkGuarded records the points f names and fails the test for a call to Point or PointFor
// that is not inside `if fault.Enabled …`.
func checkGuarded(t *testing.T, fset *token.FileSet, f *ast.File, used map[string]bool) {
	var walk func(n ast.Node, inGuard bool)
	walk = func(n ast.Node, inGuard bool) {
		ast.Inspect(n, func(m ast.Node) bool {
			switch x := m.(type) {
			case *ast.IfStmt:
				if x != n && guards(x.Cond) {
					walk(x.Body, true)
					if x.Else != nil {
						walk(x.Else, inGuard)
					}
					if x.Init != nil {
						walk(x.Init, inGuard)
					}
					return false
				}
			case *ast.SelectorExpr:
				if id, ok := x.X.(*ast.Ident); ok && id.Name == "fault" && x.Sel.Name != "Enabled" {
					if _, isConst := pointConst(x.Sel.Name); isConst {
						used[x.Sel.Name] = true
					}
				}
			case *ast.CallExpr:
				sel, ok := x.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == "fault" && (sel.Sel.Name == "Point" || sel.Sel.Name == "PointFor") {
					if !inGuard {
						t.Errorf("%s: fault.%s outside `if fault.Enabled`", fset.Position(x.Pos()), sel.Sel.Name)
					}
					if len(x.Args) > 0 {
						if a, ok := x.Args[0].(*ast.SelectorExpr); ok {
							if name, ok := pointConst(a.Sel.Name); ok {
								used[name] = true
							}
						}
					}
				}
			}
			return true
		})
	}
	walk(f, false)
}

// guards reports whether cond is fault.Enabled or a conjunction starting with it.
func guards(cond ast.Expr) bool {
	for {
		b, ok := cond.(*ast.BinaryExpr)
		if !ok || b.Op != token.LAND {
			break
		}
		cond = b.X
	}
	sel, ok := cond.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == "fault" && sel.Sel.Name == "Enabled"
}

// pointConst maps the Go name of a point's constant to the point's name.
func pointConst(goName string) (string, bool) {
	m := map[string]string{
		"AfterClaimCommit": AfterClaimCommit, "BeforeOutcome": BeforeOutcome, "AfterStepTxCommit": AfterStepTxCommit,
		"AwaitBetweenStmts": AwaitBetweenStmts,
		"DeliverBeforeWake": DeliverBeforeWake, "Heartbeat": Heartbeat, "ReaperBetweenSelectUpdate": ReaperBetweenSelectUpdate,
		"GCBetweenSelectDelete": GCBetweenSelectDelete, "GateBeforeCredit": GateBeforeCredit,
		"BucketBeforeWriteback": BucketBeforeWriteback, "InboxPurge": InboxPurge,
	}
	name, ok := m[goName]
	return name, ok
}

func BenchmarkPoint(b *testing.B) {
	for range b.N {
		if Enabled {
			_ = PointFor(BeforeOutcome, "x")
		}
		_ = Point(Heartbeat)
	}
}
