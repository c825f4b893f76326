package chain

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"
)

// The protocol package must stay pure: no clocks, sockets, locks, files
// or goroutines in any non-test file, so the simulator's schedules are
// the only ones there are.
func TestPackageIsPure(t *testing.T) {
	forbidden := map[string]bool{"time": true, "net": true, "sync": true, "sync/atomic": true, "os": true, "os/exec": true, "math/rand": true, "math/rand/v2": true}
	ents, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, e := range ents {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if forbidden[p] || strings.HasPrefix(p, "net/") {
				t.Errorf("%s imports %q", name, p)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: go statement", name)
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok && (id.Name == "time" || id.Name == "net" || id.Name == "sync" || id.Name == "os") {
					t.Errorf("%s: uses %s.%s", name, id.Name, n.Sel.Name)
				}
			}
			return true
		})
	}
	if checked < 3 {
		t.Fatalf("checked only %d files", checked)
	}
}
