package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// notParallel are the top-level tests that must not run beside others,
// and why (see README.md, "Parallel tests").
var notParallel = map[string]string{
	"TestSmoke": "checks that the process has nothing left over",
}

// TestTopLevelTestsAreParallel keeps make test's time in bounds as tests
// are added: every top-level test starts with t.Parallel() unless it is
// listed in notParallel. Pure source inspection: needs no root.
func TestTopLevelTestsAreParallel(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	fset := token.NewFileSet()
	seen := 0
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" {
				continue
			}
			seen++
			_, exempt := notParallel[fn.Name.Name]
			if parallel := startsWithParallel(fn); parallel == exempt {
				if exempt {
					t.Errorf("%s: %s calls t.Parallel() but is listed in notParallel (%s)", fset.Position(fn.Pos()), fn.Name.Name, notParallel[fn.Name.Name])
				} else {
					t.Errorf("%s: %s must start with t.Parallel() (or be listed in notParallel with the reason)", fset.Position(fn.Pos()), fn.Name.Name)
				}
			}
		}
	}
	if seen < 10 {
		t.Errorf("only %d top-level tests found", seen)
	}
}

// startsWithParallel: the function's first statement is <param>.Parallel().
func startsWithParallel(fn *ast.FuncDecl) bool {
	if fn.Body == nil || len(fn.Body.List) == 0 {
		return false
	}
	es, ok := fn.Body.List[0].(*ast.ExprStmt)
	if !ok {
		return false
	}
	call, ok := es.X.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "Parallel"
}
