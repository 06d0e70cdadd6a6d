package main

import (
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"slices"
	"strings"
)

// Surface returns the exported identifiers of the package in dir (its
// non-test files), sorted: "Name" for a package-level name, "Type.Method"
// for a method, of a concrete type or of an interface. The types named in
// exclude are left out, with their methods and the constructors go/doc
// files under them.
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
	for _, t := range d.Types {
		if slices.Contains(exclude, t.Name) {
			continue
		}
		names = append(names, t.Name)
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
						names = append(names, t.Name+"."+n.Name)
					}
				}
			}
		}
	}
	slices.Sort(names)
	return names, nil
}
