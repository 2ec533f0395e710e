package gendurable_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// quotable is code the guides may quote, and where it comes from.
type quotable struct {
	text, origin string
	// kit says it is durabletest's test code: a test, quoted by the testing guide only.
	kit bool
	// region says it is a marked region (not a whole program), which some guide must quote.
	region bool
}

// Every Go snippet in the guides (docs/*.md) and the README is compiled code a user could write,
// never the tests' own scaffolding. It is one of:
//   - a region between "// docs:begin <name>" and "// docs:end" lines of a root example file
//     (example_test.go, example_*_test.go), which `go test` runs and checks;
//   - a region of a contrib module's example file (contrib/*/example*_test.go);
//   - an example program (examples/*/main.go), whole or a region of it;
//   - a region of durabletest's tests, quoted by docs/testing.md only: there a snippet may show
//     a test (testing.T, require), since durabletest is a test kit.
//
// Regions anywhere else (the root's behaviour tests above all, whose code leans on their own
// helpers) fail the test, and so does a snippet that uses a test helper: testing.T, require or
// assert, a function of the root's behaviour tests (newEnv, start, eventually, …), the tests'
// env (e.client), or the examples' own scaffolding (examplePool). Go code in a fence not marked
// `go` fails too (it would escape all of this); an example a guide names (ExampleSpawn, …) must
// exist; and every region of the root examples, the example programs and durabletest must be
// quoted somewhere: a region nobody quotes is a guide that went its own way.
func TestGuidesQuoteCompiledCode(t *testing.T) {
	t.Parallel()
	region := regexp.MustCompile(`(?ms)^[ \t]*// docs:begin \S+\n(.*?)^[ \t]*// docs:end\n`)
	marker := regexp.MustCompile(`(?m)^[ \t]*// docs:(begin \S+|end)$`)
	// A region inside a function (every line indented) is dedented by one tab; at the top level
	// of a file gofmt puts a blank line before its end marker, which is not part of it.
	dedent := func(s string) string {
		lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
		inside := !slices.ContainsFunc(lines, func(l string) bool { return l != "" && !strings.HasPrefix(l, "\t") })
		for i, l := range lines {
			if inside {
				lines[i] = strings.TrimPrefix(l, "\t")
			}
		}
		return strings.Join(lines, "\n") + "\n"
	}

	var quotables []quotable
	allowed := map[string]bool{}
	add := func(files []string, kit bool) {
		for _, f := range files {
			allowed[f] = true
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			for _, m := range region.FindAllStringSubmatch(string(b), -1) {
				quotables = append(quotables, quotable{text: dedent(m[1]), origin: f, kit: kit, region: true})
			}
		}
	}
	glob := func(pattern string) []string {
		files, err := filepath.Glob(pattern)
		require.NoError(t, err)
		return files
	}
	add(append(glob("example_test.go"), glob("example_*_test.go")...), false)
	add(glob("durabletest/*_test.go"), true)
	contrib := glob("contrib/*/example*_test.go")
	add(contrib, false)
	programs := glob("examples/*/main.go")
	for _, p := range programs {
		allowed[p] = true
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		quotables = append(quotables, quotable{text: string(b), origin: p})
		for _, m := range region.FindAllStringSubmatch(string(b), -1) {
			quotables = append(quotables, quotable{text: dedent(m[1]), origin: p, region: true})
		}
	}
	require.NotEmpty(t, programs)
	require.NotEmpty(t, contrib)

	// No region anywhere else: a region in a behaviour test is code written for the tests.
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || allowed[path] {
			return nil
		}
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		require.False(t, marker.Match(b),
			"%s holds docs markers: guides quote examples (example_*_test.go, examples/*/main.go) and durabletest's tests only; move the code to an example", path)
		return nil
	})
	require.NoError(t, err)

	helper := testHelpers(t)
	docs := append(glob("docs/*.md"), "README.md")

	// The examples a guide names by function exist.
	declared := map[string]bool{}
	exampleFunc := regexp.MustCompile(`(?m)^func (Example\w*)\(\)`)
	for _, q := range append(append(glob("example_*_test.go"), glob("durabletest/*_test.go")...), contrib...) {
		b, err := os.ReadFile(q)
		require.NoError(t, err)
		for _, m := range exampleFunc.FindAllStringSubmatch(string(b), -1) {
			declared[m[1]] = true
		}
	}
	named := regexp.MustCompile(`\bExample\w*`)
	fence := regexp.MustCompile("(?ms)^```(\\w*)\n(.*?)^```\n")
	quoted := map[int]bool{}
	snippets := 0
	for _, d := range docs {
		b, err := os.ReadFile(d)
		require.NoError(t, err)
		for _, name := range named.FindAllString(string(b), -1) {
			require.True(t, declared[name], "%s names %s, which no example file declares", d, name)
		}
		testingGuide := d == filepath.Join("docs", "testing.md")
		for _, m := range fence.FindAllStringSubmatch(string(b), -1) {
			if m[1] != "go" {
				require.False(t, isGo(m[2]), "%s: Go code in a fence marked %q instead of go escapes this test:\n%s", d, m[1], m[2])
				continue
			}
			snippets++
			snippet := m[2]
			match := -1
			for i, q := range quotables {
				if q.text == snippet && (!q.kit || testingGuide) {
					match = i
					break
				}
			}
			require.True(t, match >= 0, "%s: a Go snippet is not compiled code (quote a region of an example, or an example program; durabletest's tests only in docs/testing.md):\n%s", d, snippet)
			quoted[match] = true
			for _, h := range helper {
				if quotables[match].kit && h.testing {
					continue // durabletest's own tests may show a test
				}
				require.False(t, h.re.MatchString(snippet), "%s: a snippet (from %s) uses %s, a test helper: guides show code a user writes\n%s",
					d, quotables[match].origin, h.name, snippet)
			}
		}
	}
	for i, q := range quotables {
		if q.region && !strings.HasPrefix(q.origin, "contrib"+string(filepath.Separator)) && !quoted[i] {
			// A region may be quoted through an identical one elsewhere.
			same := slices.ContainsFunc(quotables, func(o quotable) bool { return o.text == q.text && o.origin != q.origin })
			require.True(t, same, "%s: a docs region no guide quotes (quote it or drop its markers):\n%s", q.origin, q.text)
		}
	}
	require.GreaterOrEqual(t, snippets, 15)
}

// helperUse is a test helper a snippet must not use.
type helperUse struct {
	name string
	re   *regexp.Regexp
	// testing says it is the testing package or an assertion library: durabletest's tests, quoted
	// by the testing guide, may use it.
	testing bool
}

// testHelpers lists the test helpers a guide's snippet must not use: the testing package and the
// assertion libraries, the functions the root's behaviour tests declare and the methods of their
// env, and the examples' shared scaffolding in example_test.go.
func testHelpers(t *testing.T) []helperUse {
	helpers := []helperUse{
		{name: "testing.T", re: regexp.MustCompile(`\btesting\.(T|TB|M|B|F)\b`), testing: true},
		{name: "require", re: regexp.MustCompile(`\brequire\.`), testing: true},
		{name: "assert", re: regexp.MustCompile(`\bassert\.`), testing: true},
		{name: "t.Fatal and friends", re: regexp.MustCompile(`\bt\.(Helper|Fatal|Fatalf|Error|Errorf|Cleanup|Run|Parallel|Log|Logf)\(`), testing: true},
	}
	files, err := filepath.Glob("*_test.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	seen := map[string]bool{}
	for _, f := range files {
		example := strings.HasPrefix(f, "example_")
		if example && f != "example_test.go" {
			continue // the examples' stand-ins (deliver, debit, …) are part of what they show
		}
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, decl := range file.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok {
				continue
			}
			name := fn.Name.Name
			if fn.Recv != nil {
				// The tests' environment: e.client(t, …), e.count(t, …).
				if typeName(fn.Recv.List[0].Type) == "env" && !seen["env."+name] {
					seen["env."+name] = true
					helpers = append(helpers, helperUse{name: "env." + name, re: regexp.MustCompile(`\be\.` + name + `\(`)})
				}
				continue
			}
			if seen[name] || name == "TestMain" || name == "init" || strings.HasPrefix(name, "Test") ||
				strings.HasPrefix(name, "Benchmark") || strings.HasPrefix(name, "Fuzz") || strings.HasPrefix(name, "Example") {
				continue
			}
			seen[name] = true
			// A call of the function itself, not a method or a field of the same name.
			helpers = append(helpers, helperUse{name: name + " (" + f + ")", re: regexp.MustCompile(`(^|[^.\w])` + name + `\(`)})
		}
	}
	require.True(t, seen["newEnv"] && seen["examplePool"] && seen["env.client"], "the helpers were not found: %v", seen)
	return helpers
}

func typeName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return typeName(x.X)
	case *ast.Ident:
		return x.Name
	}
	return ""
}

// isGo reports whether text parses as Go declarations or statements (shell, SQL and PromQL do not).
func isGo(text string) bool {
	fset := token.NewFileSet()
	_, declErr := parser.ParseFile(fset, "", "package p\n"+text, parser.SkipObjectResolution)
	_, stmtErr := parser.ParseFile(fset, "", "package p\nfunc _() {\n"+text+"\n}\n", parser.SkipObjectResolution)
	return declErr == nil || stmtErr == nil
}
