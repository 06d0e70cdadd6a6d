package idempotency_test

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var (
	fuzzFuncRe   = regexp.MustCompile(`^func (Fuzz\w+)\(\w+ \*testing\.F\)`)
	ciFuzzEntry  = regexp.MustCompile(`"(\S+) (Fuzz\w+)"`)
	ciFuzzOpenRe = regexp.MustCompile(`^fuzz_targets=\($`)
)

// TestCIFuzzesEveryTarget checks that the fuzz_targets list of .ci/run
// names every fuzz target of this module under the package that declares
// it, and nothing else. `go test -fuzz` in a package without the target
// prints a warning and passes, so a target that moved to another package
// (FuzzHeader, listed under "." after it moved to ./backend) was fuzzed by
// nobody while CI stayed green.
func TestCIFuzzesEveryTarget(t *testing.T) {
	declared := map[string]string{} // "pkg target" -> file
	err := walkGoFiles(".", func(path string, src []byte) error {
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		pkg := "./" + filepath.ToSlash(filepath.Dir(path))
		if pkg == "./." {
			pkg = "."
		}
		for line := range strings.Lines(string(src)) {
			if m := fuzzFuncRe.FindStringSubmatch(line); m != nil {
				declared[pkg+" "+m[1]] = path
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(declared) == 0 {
		t.Fatal("found no fuzz target in the module: the walk is broken")
	}

	run, err := os.ReadFile(filepath.Join(".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	in := false
	for line := range strings.Lines(string(run)) {
		line = strings.TrimSpace(line)
		switch {
		case ciFuzzOpenRe.MatchString(line):
			in = true
		case in && line == ")":
			in = false
		case in:
			for _, m := range ciFuzzEntry.FindAllStringSubmatch(line, -1) {
				listed[m[1]+" "+m[2]] = true
			}
		}
	}
	if len(listed) == 0 {
		t.Fatal(".ci/run: found no fuzz_targets=( ... ) list")
	}

	for _, k := range slices.Sorted(maps.Keys(declared)) {
		if !listed[k] {
			t.Errorf(".ci/run does not fuzz %q (declared in %s): add it to fuzz_targets", k, declared[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(listed)) {
		if _, ok := declared[k]; !ok {
			t.Errorf(".ci/run fuzzes %q, which no _test.go of that package declares: go test would fuzz nothing and pass", k)
		}
	}
}
