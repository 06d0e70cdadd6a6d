package main

import (
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Surface returns the exported identifiers of the package in dir (its
// non-test files), sorted: "Name" for a package-level name, "Type.Method"
// for a method of a concrete type (or of the type an alias names), and
// "Type.Method()" for a method of an interface. The types named in exclude
// are left out, with their methods and the constructors go/doc files
// under them.
func Surface(dir string, exclude ...string) ([]string, error) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for name, p := range pkgs {
		if name == "main" || strings.HasSuffix(name, "_test") {
			continue
		}
		for _, f := range p.Files {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no package", dir)
	}
	d, err := doc.NewFromFiles(fset, files, "x")
	if err != nil {
		return nil, err
	}
	var names []string
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			for _, n := range v.Names {
				if token.IsExported(n) {
					names = append(names, n)
				}
			}
		}
	}
	values(d.Consts)
	values(d.Vars)
	for _, f := range d.Funcs {
		names = append(names, f.Name)
	}
	aliases, err := aliasMethods(dir, files)
	if err != nil {
		return nil, err
	}
	for _, t := range d.Types {
		if slices.Contains(exclude, t.Name) {
			continue
		}
		names = append(names, t.Name)
		for _, m := range aliases[t.Name] {
			names = append(names, t.Name+"."+m)
		}
		values(t.Consts)
		values(t.Vars)
		for _, f := range t.Funcs {
			names = append(names, f.Name)
		}
		for _, m := range t.Methods {
			names = append(names, t.Name+"."+m.Name)
		}
		for _, spec := range t.Decl.Specs {
			ts, ok := spec.(*ast.TypeSpec)
			if !ok {
				continue
			}
			it, ok := ts.Type.(*ast.InterfaceType)
			if !ok {
				continue
			}
			for _, m := range it.Methods.List {
				for _, n := range m.Names {
					if n.IsExported() {
						names = append(names, t.Name+"."+n.Name+"()")
					}
				}
			}
		}
	}
	slices.Sort(names)
	return names, nil
}

// aliasMethods returns, for each exported alias of a type of another
// package of the same module (type Key = backend.Key), the exported
// methods of that type: a user reads them on the alias.
func aliasMethods(dir string, files []*ast.File) (map[string][]string, error) {
	out := map[string][]string{}
	parsed := map[string]map[string][]string{} // a directory's methods by type, parsed once
	for _, f := range files {
		imports := map[string]string{}
		for _, imp := range f.Imports {
			p := strings.Trim(imp.Path.Value, `"`)
			name := path.Base(p)
			if imp.Name != nil {
				name = imp.Name.Name
			}
			imports[name] = p
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				sel, ok := ts.Type.(*ast.SelectorExpr)
				if !ts.Assign.IsValid() || !ok || !ts.Name.IsExported() {
					continue
				}
				pkg, ok := sel.X.(*ast.Ident)
				if !ok {
					continue
				}
				target, err := moduleDir(dir, imports[pkg.Name])
				if err != nil {
					return nil, err
				}
				if target == "" {
					continue
				}
				methods, ok := parsed[target]
				if !ok {
					if methods, err = methodsByType(target); err != nil {
						return nil, err
					}
					parsed[target] = methods
				}
				out[ts.Name.Name] = methods[sel.Sel.Name]
			}
		}
	}
	return out, nil
}

// moduleDir is the directory of importPath if it belongs to the module
// that holds dir, "" otherwise.
func moduleDir(dir, importPath string) (string, error) {
	root, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(root, "go.mod")); err == nil {
			mod := modfileModule(string(b))
			if rest, ok := strings.CutPrefix(importPath, mod+"/"); ok {
				return filepath.Join(root, filepath.FromSlash(rest)), nil
			}
			return "", nil
		}
		up := filepath.Dir(root)
		if up == root {
			return "", fmt.Errorf("%s: no go.mod above it", dir)
		}
		root = up
	}
}

// modfileModule is the module path a go.mod declares.
func modfileModule(gomod string) string {
	for _, line := range strings.Split(gomod, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// methodsByType lists the exported methods of each type declared in dir,
// sorted, by type name.
func methodsByType(dir string) (map[string][]string, error) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	ms := map[string][]string{}
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, decl := range f.Decls {
				fd, ok := decl.(*ast.FuncDecl)
				if !ok || fd.Recv == nil || !fd.Name.IsExported() {
					continue
				}
				rt := fd.Recv.List[0].Type
				if st, ok := rt.(*ast.StarExpr); ok {
					rt = st.X
				}
				if id, ok := rt.(*ast.Ident); ok {
					ms[id.Name] = append(ms[id.Name], fd.Name.Name)
				}
			}
		}
	}
	for _, names := range ms {
		slices.Sort(names)
	}
	return ms, nil
}

// Count is how many of names are not methods of an interface (the count
// the project's limits apply to, as issue 31 counted: types, funcs,
// methods, consts, vars), and how many are.
func Count(names []string) (identifiers, interfaceMethods int) {
	for _, n := range names {
		if strings.HasSuffix(n, "()") {
			interfaceMethods++
		} else {
			identifiers++
		}
	}
	return identifiers, interfaceMethods
}
