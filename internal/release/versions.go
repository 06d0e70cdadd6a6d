package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

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
