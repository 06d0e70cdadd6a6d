package main

import (
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// publicPackages lists the import paths of the packages in the module at
// dir (path modPath) that another module can import. It leaves out main,
// internal, and packages in a nested module, in testdata or in a directory
// the go command ignores.
func publicPackages(dir, modPath string) ([]string, error) {
	var pkgs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if !d.IsDir() {
			return nil
		}
		base := d.Name()
		if rel != "." {
			if strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") || base == "testdata" || base == "internal" {
				return fs.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return fs.SkipDir
			}
		}
		name, err := packageName(p)
		if err != nil {
			return err
		}
		if name == "" || name == "main" {
			return nil
		}
		ip := modPath
		if rel != "." {
			ip = modPath + "/" + rel
		}
		pkgs = append(pkgs, ip)
		return nil
	})
	if err == nil && len(pkgs) == 0 {
		err = errors.New("the module has no package another module can import")
	}
	return pkgs, err
}

// packageName is the package clause of the non-test Go files in dir, or ""
// when there are none.
func packageName(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, n), nil, parser.PackageClauseOnly)
		if err != nil {
			return "", err
		}
		return f.Name.Name, nil
	}
	return "", nil
}

// consume builds, in dir, a module that requires r at its version and a
// program that imports pkgs and prints a line, then runs it.
func consume(dir string, env []string, r release, pkgs []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	gomod := "module example.com/consumer\n\ngo 1.26.0\n"
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod), 0o644); err != nil {
		return err
	}
	var src strings.Builder
	src.WriteString("// Command consumer imports every public package of one released module.\npackage main\n\nimport (\n\t\"fmt\"\n\n")
	for _, p := range slices.Sorted(slices.Values(pkgs)) {
		fmt.Fprintf(&src, "\t_ %q\n", p)
	}
	fmt.Fprintf(&src, ")\n\nfunc main() { fmt.Println(%q) }\n", "ok "+r.Path+"@"+r.Version)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src.String()), 0o644); err != nil {
		return err
	}
	run := func(name string, args ...string) (string, error) {
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out), nil
	}
	if _, err := run("go", "get", r.Path+"@"+r.Version); err != nil {
		return err
	}
	f, err := readMod(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	if len(f.Replace) > 0 {
		return errors.New("the consumer's go.mod has a replace directive")
	}
	if _, err := run("go", "build", "-o", "consumer", "."); err != nil {
		return err
	}
	out, err := run(filepath.Join(dir, "consumer"))
	if err != nil {
		return err
	}
	if want := "ok " + r.Path + "@" + r.Version + "\n"; out != want {
		return fmt.Errorf("the consumer printed %q, want %q", out, want)
	}
	return nil
}
