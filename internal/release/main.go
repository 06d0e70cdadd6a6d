// Command release records, tags and checks the versions of this
// repository's published modules.
//
// The modules and their versions are listed in versions.txt beside this
// file, in tagging order (a module after every module it requires). A
// module in directory dir is tagged dir/vX.Y.Z; the root module vX.Y.Z.
//
//	go run -C internal/release . check   # what CI runs
//	go run -C internal/release . tag     # tags HEAD, in order
//
// The check subcommand clones the repository's HEAD into a scratch
// directory and creates the tags there. It builds a module proxy directory
// from them (zips made by golang.org/x/mod/zip). Then, for each module, it
// builds and runs a small consumer program that imports every public
// package of the module. Before that, it fills the local module cache with
// the module's third-party requirements (with the usual GOPROXY). The
// build then uses GOPROXY set to that directory and the local module cache
// (no network), no replace directive and GOFLAGS=-mod=mod. It fails if any module does not
// resolve, build or run, or if a module requires another module of this
// repository at a version other than the recorded one.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

// root is the module path of the repository's root module.
const root = "github.com/go-idempotency/idempotency"

// release is one published module at its recorded version.
type release struct {
	Dir     string // slash-separated, relative to the repository root; "." for the root
	Path    string // module path
	Version string
}

// Tag is the git tag of r.
func (r release) Tag() string {
	if r.Dir == "." {
		return r.Version
	}
	return r.Dir + "/" + r.Version
}

func main() {
	repo := flag.String("repo", "../..", "the repository's root directory")
	keep := flag.Bool("keep", false, "check: keep the scratch directory and print its path")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: release [-repo DIR] check|tag")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	var err error
	switch flag.Arg(0) {
	case "check":
		err = check(*repo, *keep)
	case "tag":
		err = tag(*repo)
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

// readVersions parses versions.txt of the repository at repo.
func readVersions(repo string) ([]release, error) {
	name := filepath.Join(repo, "internal", "release", "versions.txt")
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	return parseVersions(data)
}

// parseVersions parses the lines "dir version" of versions.txt; '#' starts
// a comment.
func parseVersions(data []byte) ([]release, error) {
	var rels []release
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("versions.txt:%d: want \"dir version\", got %q", n, sc.Text())
		}
		dir, v := path.Clean(fields[0]), fields[1]
		if !semver.IsValid(v) || semver.Canonical(v) != v || semver.Build(v) != "" {
			return nil, fmt.Errorf("versions.txt:%d: %q is not a canonical semantic version", n, v)
		}
		if path.IsAbs(dir) || dir == ".." || strings.HasPrefix(dir, "../") {
			return nil, fmt.Errorf("versions.txt:%d: %q is outside the repository", n, dir)
		}
		if seen[dir] {
			return nil, fmt.Errorf("versions.txt:%d: %s listed twice", n, dir)
		}
		seen[dir] = true
		p := root
		if dir != "." {
			p = root + "/" + dir
		}
		if major := semver.Major(v); major != "v0" && major != "v1" {
			return nil, fmt.Errorf("versions.txt:%d: %s needs a /%s module path", n, dir, major)
		}
		rels = append(rels, release{Dir: dir, Path: p, Version: v})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(rels) == 0 {
		return nil, errors.New("versions.txt lists no module")
	}
	return rels, nil
}

// verify checks the go.mod files of the repository at repo against rels:
//
//   - each listed module exists under its path;
//   - each requires the listed modules it depends on at their recorded
//     versions, and only after them in the list;
//   - every module of the repository outside examples/ and internal/ is
//     listed.
func verify(repo string, rels []release) error {
	byPath := map[string]int{}
	for i, r := range rels {
		byPath[r.Path] = i
	}
	var errs []error
	for i, r := range rels {
		f, err := readMod(filepath.Join(repo, filepath.FromSlash(r.Dir), "go.mod"))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if f.Module == nil || f.Module.Mod.Path != r.Path {
			errs = append(errs, fmt.Errorf("%s/go.mod: module path is not %s", r.Dir, r.Path))
		}
		for _, req := range f.Require {
			j, ours := byPath[req.Mod.Path]
			switch {
			case strings.HasPrefix(req.Mod.Path, root) && !ours:
				errs = append(errs, fmt.Errorf("%s requires %s, which versions.txt does not list", r.Dir, req.Mod.Path))
			case !ours:
			case req.Mod.Version != rels[j].Version:
				errs = append(errs, fmt.Errorf("%s requires %s %s; versions.txt records %s", r.Dir, req.Mod.Path, req.Mod.Version, rels[j].Version))
			case j >= i:
				errs = append(errs, fmt.Errorf("versions.txt lists %s before %s, which it requires", r.Dir, rels[j].Dir))
			}
		}
	}
	listed := map[string]bool{}
	for _, r := range rels {
		listed[r.Dir] = true
	}
	err := filepath.WalkDir(repo, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repo, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			base := d.Name()
			if rel != "." && (strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") || base == "testdata" ||
				rel == "examples" || rel == "internal") {
				return fs.SkipDir
			}
			return nil
		}
		if d.Name() == "go.mod" && !listed[path.Dir(rel)] {
			errs = append(errs, fmt.Errorf("module %s is not listed in versions.txt (outside examples/ and internal/, every module is published)", path.Dir(rel)))
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func readMod(name string) (*modfile.File, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	return modfile.ParseLax(name, data, nil)
}

// tag creates an annotated tag at HEAD for each module of versions.txt, in
// its order. It refuses a dirty tree and a tag that already names another
// commit; a tag that already names HEAD is left as it is.
func tag(repo string) error {
	rels, err := readVersions(repo)
	if err != nil {
		return err
	}
	if err := verify(repo, rels); err != nil {
		return err
	}
	if out, err := git(repo, "status", "--porcelain"); err != nil {
		return err
	} else if out != "" {
		return errors.New("the work tree has uncommitted changes; commit them first")
	}
	return createTags(repo, rels, os.Stdout)
}

func createTags(repo string, rels []release, log *os.File) error {
	head, err := git(repo, "rev-parse", "HEAD")
	if err != nil {
		return err
	}
	for _, r := range rels {
		at, err := git(repo, "rev-parse", "-q", "--verify", "refs/tags/"+r.Tag()+"^{commit}")
		switch {
		case err == nil && at == head:
			fmt.Fprintf(log, "release: %s already tags HEAD\n", r.Tag())
			continue
		case err == nil:
			return fmt.Errorf("tag %s already names %s, not HEAD %s", r.Tag(), at, head)
		}
		if _, err := git(repo, "tag", "-a", r.Tag(), "-m", r.Path+" "+r.Version); err != nil {
			return err
		}
		fmt.Fprintf(log, "release: tagged %s\n", r.Tag())
	}
	return nil
}

func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// check is described in the package doc.
func check(repo string, keep bool) error {
	scratch, err := os.MkdirTemp("", "release-check-")
	if err != nil {
		return err
	}
	if keep {
		fmt.Println("release: scratch directory", scratch)
	} else {
		defer removeAll(scratch)
	}
	src := filepath.Join(scratch, "src")
	absRepo, err := filepath.Abs(repo)
	if err != nil {
		return err
	}
	if _, err := git(scratch, "clone", "-q", "--no-local", "--no-tags", absRepo, src); err != nil {
		return err
	}
	// Everything below reads the clone: what is committed, not the work tree.
	rels, err := readVersions(src)
	if err != nil {
		return err
	}
	if err := verify(src, rels); err != nil {
		return err
	}
	if _, err := git(src, "config", "user.name", "release check"); err != nil {
		return err
	}
	if _, err := git(src, "config", "user.email", "release@localhost"); err != nil {
		return err
	}
	if err := createTags(src, rels, os.Stdout); err != nil {
		return err
	}
	when, err := git(src, "log", "-1", "--format=%cI")
	if err != nil {
		return err
	}
	t, err := time.Parse(time.RFC3339, when)
	if err != nil {
		return err
	}
	proxy := filepath.Join(scratch, "proxy")
	for _, r := range rels {
		if err := publish(proxy, src, r, t.UTC()); err != nil {
			return fmt.Errorf("%s: %w", r.Tag(), err)
		}
	}
	for _, r := range rels {
		if err := warm(filepath.Join(src, filepath.FromSlash(r.Dir))); err != nil {
			return fmt.Errorf("%s: %w", r.Tag(), err)
		}
	}
	cache, err := goEnv("GOMODCACHE")
	if err != nil {
		return err
	}
	env := append(os.Environ(),
		"GOPROXY=file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(filepath.Join(cache, "cache", "download")),
		"GOMODCACHE="+filepath.Join(scratch, "modcache"),
		"GOFLAGS=-mod=mod",
		"GOSUMDB=off",
		"GONOSUMDB=", "GOPRIVATE=", "GONOPROXY=",
		"GOWORK=off",
		"GOTOOLCHAIN=local",
	)
	var errs []error
	for _, r := range rels {
		pkgs, err := publicPackages(filepath.Join(src, filepath.FromSlash(r.Dir)), r.Path)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.Tag(), err))
			continue
		}
		if err := consume(filepath.Join(scratch, "consumers", strings.ReplaceAll(r.Dir, "/", "_")), env, r, pkgs); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.Tag(), err))
			continue
		}
		fmt.Printf("release: %s@%s resolves from the local proxy, builds and runs (%d packages)\n", r.Path, r.Version, len(pkgs))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Printf("release: %d modules checked\n", len(rels))
	return nil
}

// removeAll removes dir, after making the module cache's read-only files
// writable.
func removeAll(dir string) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o755)
		}
		return nil
	})
	_ = os.RemoveAll(dir)
}

// warm fills the local module cache with what a consumer of the module in
// dir needs from outside this repository: the go.mod file of every module
// in its requirement graph and the zips of the modules its packages use.
// It runs with the caller's own GOPROXY, so that the consumers' builds
// that follow need no network. A fresh machine's cache holds only what
// builds and tests of this repository fetched. It lacks the older go.mod
// files that resolving a module from scratch reads.
func warm(dir string) error {
	for _, args := range [][]string{{"mod", "graph"}, {"mod", "download"}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

func goEnv(name string) (string, error) {
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %w", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// publish writes r's .info, .mod and .zip (made from its directory in src)
// into the module proxy directory proxy.
func publish(proxy, src string, r release, t time.Time) error {
	esc, err := module.EscapePath(r.Path)
	if err != nil {
		return err
	}
	dir := filepath.Join(proxy, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	mv := module.Version{Path: r.Path, Version: r.Version}
	modDir := filepath.Join(src, filepath.FromSlash(r.Dir))
	cf, err := zip.CheckDir(modDir)
	if err != nil {
		return err
	}
	if err := cf.Err(); err != nil {
		return err
	}
	z, err := os.Create(filepath.Join(dir, r.Version+".zip"))
	if err != nil {
		return err
	}
	if err := zip.CreateFromDir(z, mv, modDir); err != nil {
		z.Close()
		return err
	}
	if err := z.Close(); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(modDir, "go.mod"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, r.Version+".mod"), gomod, 0o644); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{r.Version, t})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, r.Version+".info"), info, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "list"), []byte(r.Version+"\n"), 0o644)
}

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
