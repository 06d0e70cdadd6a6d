package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

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
