package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

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
