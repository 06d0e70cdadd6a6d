package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// modulePath is the path of this module (and of its core package).
const modulePath = "github.com/go-idempotency/idempotency"

// backendPath and observePath are the store contract's package and the
// observer's: with the root package, the core, which imports only the
// standard library.
const (
	backendPath = modulePath + "/backend"
	observePath = modulePath + "/observe"
)

// isCore reports whether path is one of the core's three packages.
func isCore(path string) bool {
	return path == modulePath || path == backendPath || path == observePath
}

// importRules lists, for each library package of the module, the modules
// it may import besides the standard library and the core package: a
// backend its own driver, the outbox integration pgx (it writes through
// pgx.Tx and *sql.Tx), nothing else. A library package of the module that
// is not listed (a new one) may import the standard library and the
// module's own non-test packages only.
var importRules = map[string][]string{
	modulePath:                  nil,
	backendPath:                 nil,
	observePath:                 nil,
	modulePath + "/sqlite":      {"modernc.org/sqlite"},
	modulePath + "/postgres":    {"github.com/jackc/pgx/v5"},
	modulePath + "/mysql":       {"github.com/go-sql-driver/mysql"},
	modulePath + "/redis":       {"github.com/redis/go-redis/v9"},
	modulePath + "/conformance": nil,
	modulePath + "/idemhttp":    nil,
	modulePath + "/outbox":      {"github.com/jackc/pgx/v5"},
}

// listedPackage is the part of `go list -json` output the rules need.
type listedPackage struct {
	ImportPath string
	Name       string
	Standard   bool
	Imports    []string
	Deps       []string
	Module     *struct{ Path string }
}

// TestLibraryImports: the core imports only the standard library, every
// backend only the standard library, the core and its own driver, and no
// library package depends on a test kit (a package of the module's
// internal/ tree that imports "testing").
func TestLibraryImports(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-deps", "-json=ImportPath,Name,Standard,Imports,Deps,Module", "./...")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	pkgs, err := decodePackages(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range checkImports(pkgs, importRules) {
		t.Error(p)
	}
	var libs []string
	for path, p := range pkgs {
		if isLibrary(p) {
			libs = append(libs, strings.TrimPrefix(strings.TrimPrefix(path, modulePath), "/"))
		}
	}
	slices.Sort(libs)
	t.Logf("library packages checked: %q", libs)
}

func decodePackages(r io.Reader) (map[string]*listedPackage, error) {
	pkgs := map[string]*listedPackage{}
	dec := json.NewDecoder(r)
	for {
		var p listedPackage
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			return pkgs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("go list output: %w", err)
		}
		pkgs[p.ImportPath] = &p
	}
}

// isLibrary reports whether p is a library package of this module: not a
// command, not under internal/.
func isLibrary(p *listedPackage) bool {
	return p.Module != nil && p.Module.Path == modulePath && p.Name != "main" &&
		!strings.Contains(p.ImportPath+"/", "/internal/")
}

// isStdlibHelper reports whether p is a non-test package of this module's
// internal/ tree that imports only the standard library (and backend, the
// store contract).
func isStdlibHelper(p *listedPackage, pkgs map[string]*listedPackage) bool {
	if p.Module == nil || p.Module.Path != modulePath || !strings.Contains(p.ImportPath+"/", "/internal/") || isTestKit(p) {
		return false
	}
	for _, imp := range p.Imports {
		if dep := pkgs[imp]; dep == nil || !dep.Standard && imp != backendPath {
			return false
		}
	}
	return true
}

// isTestKit reports whether p is a test helper package of this module.
func isTestKit(p *listedPackage) bool {
	return p.Module != nil && p.Module.Path == modulePath &&
		strings.Contains(p.ImportPath+"/", "/internal/") && slices.Contains(p.Imports, "testing")
}

// checkImports applies rules to the listed packages and returns what
// breaks them.
func checkImports(pkgs map[string]*listedPackage, rules map[string][]string) []string {
	var problems []string
	for _, path := range slices.Sorted(maps.Keys(rules)) {
		if _, ok := pkgs[path]; !ok {
			problems = append(problems, fmt.Sprintf("%s: not listed by go list (renamed? update importRules)", path))
		}
	}
	for _, path := range slices.Sorted(maps.Keys(pkgs)) {
		p := pkgs[path]
		if !isLibrary(p) {
			continue
		}
		drivers, listed := rules[path]
		for _, imp := range p.Imports {
			dep := pkgs[imp]
			switch {
			case dep == nil:
				problems = append(problems, fmt.Sprintf("%s imports %s, which go list did not describe", path, imp))
			case dep.Standard, isCore(imp): // the core (its packages cannot import each other in a cycle)
			case dep.Module != nil && slices.Contains(drivers, dep.Module.Path):
			case !listed && dep.Module != nil && dep.Module.Path == modulePath && !isTestKit(dep):
			case strings.HasPrefix(imp, path+"/") && isLibrary(dep): // its own subpackage, checked in turn
			case isStdlibHelper(dep, pkgs): // internal/sqlident, internal/canonical and the like
			default:
				allowed := "the standard library"
				switch {
				case isCore(path):
				case listed && len(drivers) > 0:
					allowed += ", the core and " + strings.Join(drivers, ", ")
				case listed:
					allowed += " and the core"
				default:
					allowed += " and this module's packages"
				}
				problems = append(problems, fmt.Sprintf("%s imports %s: a library package may import only %s", path, imp, allowed))
			}
		}
		for _, d := range p.Deps {
			if dep := pkgs[d]; dep != nil && isTestKit(dep) {
				problems = append(problems, fmt.Sprintf("%s depends on the test kit %s", path, d))
			}
		}
		if isCore(path) {
			for _, d := range p.Deps {
				if dep := pkgs[d]; dep != nil && !dep.Standard && !isCore(d) && !isStdlibHelper(dep, pkgs) {
					problems = append(problems, fmt.Sprintf("the core depends on %s, outside the standard library", d))
				}
			}
		}
	}
	return problems
}

// TestImportRulesFail makes sure the check catches what it must.
func TestImportRulesFail(t *testing.T) {
	mod := func(path string) *struct{ Path string } { return &struct{ Path string }{path} }
	base := func() map[string]*listedPackage {
		return map[string]*listedPackage{
			"fmt":                        {ImportPath: "fmt", Standard: true},
			"testing":                    {ImportPath: "testing", Standard: true},
			modulePath:                   {ImportPath: modulePath, Name: "idempotency", Imports: []string{"fmt"}, Deps: []string{"fmt"}, Module: mod(modulePath)},
			modulePath + "/sqlite":       {ImportPath: modulePath + "/sqlite", Name: "sqlite", Imports: []string{"fmt", modulePath, "modernc.org/sqlite"}, Module: mod(modulePath)},
			modulePath + "/extra":        {ImportPath: modulePath + "/extra", Name: "extra", Imports: []string{"fmt", modulePath + "/sqlite"}, Module: mod(modulePath)},
			modulePath + "/internal/kit": {ImportPath: modulePath + "/internal/kit", Name: "kit", Imports: []string{"testing"}, Module: mod(modulePath)},
			modulePath + "/cmd/tool":     {ImportPath: modulePath + "/cmd/tool", Name: "main", Imports: []string{modulePath + "/internal/kit", "github.com/x/y"}, Module: mod(modulePath)},
			"modernc.org/sqlite":         {ImportPath: "modernc.org/sqlite", Name: "sqlite", Module: mod("modernc.org/sqlite")},
			"github.com/x/y":             {ImportPath: "github.com/x/y", Name: "y", Module: mod("github.com/x/y")},
		}
	}
	rules := map[string][]string{modulePath: nil, modulePath + "/sqlite": {"modernc.org/sqlite"}}
	if p := checkImports(base(), rules); len(p) != 0 {
		t.Fatalf("a clean module: problems %q", p)
	}
	for name, tc := range map[string]struct {
		spoil func(map[string]*listedPackage)
		want  string
	}{
		"core imports a driver": {func(m map[string]*listedPackage) {
			m[modulePath].Imports = append(m[modulePath].Imports, "modernc.org/sqlite")
		}, modulePath + " imports modernc.org/sqlite: a library package may import only the standard library"},
		"core depends on a module": {func(m map[string]*listedPackage) {
			m[modulePath].Deps = append(m[modulePath].Deps, "github.com/x/y")
		}, "the core depends on github.com/x/y"},
		"backend imports another module": {func(m map[string]*listedPackage) {
			m[modulePath+"/sqlite"].Imports = append(m[modulePath+"/sqlite"].Imports, "github.com/x/y")
		}, "/sqlite imports github.com/x/y: a library package may import only the standard library, the core and modernc.org/sqlite"},
		"backend imports another backend": {func(m map[string]*listedPackage) {
			m[modulePath+"/sqlite"].Imports = append(m[modulePath+"/sqlite"].Imports, modulePath+"/extra")
		}, "/sqlite imports " + modulePath + "/extra"},
		"new package imports a module": {func(m map[string]*listedPackage) {
			m[modulePath+"/extra"].Imports = append(m[modulePath+"/extra"].Imports, "github.com/x/y")
		}, "/extra imports github.com/x/y: a library package may import only the standard library and this module's packages"},
		"library uses the test kit": {func(m map[string]*listedPackage) {
			m[modulePath+"/extra"].Imports = append(m[modulePath+"/extra"].Imports, modulePath+"/internal/kit")
			m[modulePath+"/extra"].Deps = append(m[modulePath+"/extra"].Deps, modulePath+"/internal/kit")
		}, "/extra depends on the test kit " + modulePath + "/internal/kit"},
		"listed package gone": {func(m map[string]*listedPackage) {
			delete(m, modulePath+"/sqlite")
		}, "/sqlite: not listed by go list"},
	} {
		m := base()
		tc.spoil(m)
		p := checkImports(m, rules)
		if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
			t.Errorf("%s: problems %q, want one containing %q", name, p, tc.want)
		}
	}
}
