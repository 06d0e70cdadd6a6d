package idempotency_test

import (
	"bufio"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The README rule: every ```go block of README.md and docs/*.md is the
// text of a region of a compiled Go file, so that no snippet can stop
// compiling unnoticed. A block is preceded by the line
//
//	<!-- readme:NAME -->
//
// and equals the lines between "// readme:begin NAME" and
// "// readme:end NAME" in some .go file of the repository (any module,
// testdata skipped), with the region's common leading tabs removed and
// trailing whitespace ignored. Blocks in other languages are not checked.
//
// README_PATH, a list of files separated by the OS's list separator,
// replaces README.md (for checking a draft, such as a README prepared
// elsewhere); docs/*.md are checked in any case.

var (
	readmeMarkerRe = regexp.MustCompile(`^<!--\s*readme:(\S*)\s*-->$`)
	readmeNameRe   = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)
)

// readmeRegion is the text between a region's markers.
type readmeRegion struct {
	file  string // where it is, for messages
	line  int    // line of the first text line
	lines []string
}

// TestReadmeSnippets checks every Go block of the README and docs/*.md
// against the region it names.
func TestReadmeSnippets(t *testing.T) {
	regions, problems := readmeRegions(".")
	docs := filepath.SplitList(os.Getenv("README_PATH"))
	if len(docs) == 0 {
		docs = []string{"README.md"}
	}
	more, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, more...)
	blocks := 0
	for _, doc := range docs {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		n, p := readmeCheckDoc(doc, string(text), regions)
		blocks += n
		problems = append(problems, p...)
	}
	for _, p := range problems {
		t.Error(p)
	}
	t.Logf("%d Go blocks in %v checked against %d regions", blocks, docs, len(regions))
}

// readmeRegions reads the regions of every .go file under root, skipping
// testdata, vendor and hidden directories, and reports malformed and
// duplicate markers.
func readmeRegions(root string) (map[string]readmeRegion, []string) {
	regions := map[string]readmeRegion{}
	var problems []string
	err := walkGoFiles(root, func(path string, src []byte) error {
		found, p := readmeParseRegions(path, string(src))
		problems = append(problems, p...)
		for _, name := range slices.Sorted(maps.Keys(found)) {
			r := found[name]
			if prev, dup := regions[name]; dup {
				problems = append(problems, fmt.Sprintf("%s:%d: region %q already defined at %s:%d", r.file, r.line-1, name, prev.file, prev.line-1))
				continue
			}
			regions[name] = r
		}
		return nil
	})
	if err != nil {
		problems = append(problems, err.Error())
	}
	return regions, problems
}

// walkGoFiles calls fn with the path and content of every .go file under
// root, in every module of the repository, skipping testdata, vendor,
// node_modules and hidden directories.
func walkGoFiles(root string, fn func(path string, src []byte) error) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (name == "testdata" || name == "vendor" || name == "node_modules" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return fn(path, src)
	})
}

// readmeParseRegions returns the regions of one Go file.
func readmeParseRegions(file, src string) (map[string]readmeRegion, []string) {
	regions := map[string]readmeRegion{}
	var problems []string
	var open string // name of the region being read
	var cur readmeRegion
	sc := bufio.NewScanner(strings.NewReader(src))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		kind, name, ok := readmeMarker(line)
		if !ok {
			if open != "" {
				cur.lines = append(cur.lines, line)
			}
			continue
		}
		where := fmt.Sprintf("%s:%d", file, n)
		switch {
		case !readmeNameRe.MatchString(name):
			problems = append(problems, fmt.Sprintf("%s: region name %q: want lowercase letters, digits and dashes", where, name))
		case kind == "begin" && open != "":
			problems = append(problems, fmt.Sprintf("%s: region %q begins inside region %q", where, name, open))
		case kind == "begin":
			if _, dup := regions[name]; dup {
				problems = append(problems, fmt.Sprintf("%s: region %q already defined in this file", where, name))
			}
			open, cur = name, readmeRegion{file: file, line: n + 1}
		case open == "":
			problems = append(problems, fmt.Sprintf("%s: end of region %q that did not begin", where, name))
		case name != open:
			problems = append(problems, fmt.Sprintf("%s: end of region %q inside region %q", where, name, open))
		default:
			cur.lines = readmeDedent(cur.lines)
			regions[name] = cur
			open = ""
		}
	}
	if err := sc.Err(); err != nil {
		problems = append(problems, fmt.Sprintf("%s: %v", file, err))
	}
	if open != "" {
		problems = append(problems, fmt.Sprintf("%s:%d: region %q never ends", file, cur.line-1, open))
	}
	return regions, problems
}

// readmeMarker recognises "// readme:begin NAME" and "// readme:end NAME"
// lines (with any indentation).
func readmeMarker(line string) (kind, name string, ok bool) {
	rest, found := strings.CutPrefix(strings.TrimSpace(line), "// readme:")
	if !found {
		return "", "", false
	}
	kind, name, _ = strings.Cut(rest, " ")
	if kind != "begin" && kind != "end" {
		return "", "", false
	}
	return kind, strings.TrimSpace(name), true
}

// readmeDedent removes the tabs that every non-blank line starts with,
// trailing whitespace and trailing blank lines (gofmt puts one between a
// function and a comment that follows it).
func readmeDedent(lines []string) []string {
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	common := -1
	for _, l := range lines {
		if strings.TrimSpace(l) == "" {
			continue
		}
		tabs := len(l) - len(strings.TrimLeft(l, "\t"))
		if common < 0 || tabs < common {
			common = tabs
		}
	}
	out := make([]string, len(lines))
	for i, l := range lines {
		l = strings.TrimRight(l, " \t\r")
		if len(l) >= common && common > 0 {
			l = l[common:]
		}
		out[i] = l
	}
	return out
}

// readmeCheckDoc checks the Go blocks of one markdown document and
// returns how many it found and what is wrong.
func readmeCheckDoc(doc, text string, regions map[string]readmeRegion) (int, []string) {
	var problems []string
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	blocks := 0
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimSpace(lines[i])
		if m := readmeMarkerRe.FindStringSubmatch(trimmed); m != nil {
			next := ""
			if i+1 < len(lines) {
				next = strings.TrimSpace(lines[i+1])
			}
			if readmeFenceLang(next) != "go" {
				problems = append(problems, fmt.Sprintf("%s:%d: <!-- readme:%s --> is not right before a ```go block", doc, i+1, m[1]))
			}
			continue
		}
		if !strings.HasPrefix(trimmed, "```") {
			continue
		}
		lang := readmeFenceLang(trimmed)
		indent := lines[i][:len(lines[i])-len(strings.TrimLeft(lines[i], " "))]
		start := i + 1
		end := start
		for end < len(lines) && strings.TrimSpace(lines[end]) != "```" {
			end++
		}
		body := make([]string, 0, end-start)
		for _, l := range lines[start:min(end, len(lines))] {
			body = append(body, strings.TrimRight(strings.TrimPrefix(l, indent), " \t"))
		}
		for len(body) > 0 && body[len(body)-1] == "" {
			body = body[:len(body)-1] // as readmeDedent does for regions
		}
		if end == len(lines) {
			problems = append(problems, fmt.Sprintf("%s:%d: code block never closed", doc, i+1))
		}
		i = end // skip the block and its closing fence
		if lang != "go" {
			continue
		}
		blocks++
		var name string
		if start >= 2 {
			if m := readmeMarkerRe.FindStringSubmatch(strings.TrimSpace(lines[start-2])); m != nil {
				name = m[1]
			}
		}
		if name == "" {
			problems = append(problems, fmt.Sprintf("%s:%d: ```go block without a <!-- readme:NAME --> line right before it (every Go block must be a region of a compiled file)", doc, start))
			continue
		}
		r, ok := regions[name]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s:%d: no Go file has a region %q (// readme:begin %s ... // readme:end %s)", doc, start-1, name, name, name))
			continue
		}
		if d := readmeDiff(body, r.lines); d >= 0 {
			got, want := "(end of block)", "(end of region)"
			if d < len(body) {
				got = body[d]
			}
			if d < len(r.lines) {
				want = r.lines[d]
			}
			problems = append(problems, fmt.Sprintf("%s:%d: block %q differs from its region at %s:%d, first at line %d of the block:\n  %s: %q\n  %s: %q",
				doc, start+d+1, name, r.file, r.line+d, d+1, doc, got, r.file, want))
		}
	}
	return blocks, problems
}

// readmeFenceLang returns the language of an opening fence line, "" for a
// fence without one, and "-" for a line that is not a fence.
func readmeFenceLang(line string) string {
	info, ok := strings.CutPrefix(line, "```")
	if !ok {
		return "-"
	}
	if f := strings.Fields(info); len(f) > 0 {
		return f[0]
	}
	return ""
}

// readmeDiff returns the index of the first line where a and b differ, or
// -1 when they are equal.
func readmeDiff(a, b []string) int {
	for i := range max(len(a), len(b)) {
		if i >= len(a) || i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return -1
}

// TestReadmeChecker makes sure the checker fails where it must.
func TestReadmeChecker(t *testing.T) {
	src := "package x\n\nfunc f() {\n\t// readme:begin demo-one\n\tx := 1\n\n\tif x > 0 {   \n\t\tprintln(x)\n\t}\n\t// readme:end demo-one\n}\n"
	regions, problems := readmeParseRegions("x.go", src)
	if len(problems) != 0 {
		t.Fatalf("problems: %q", problems)
	}
	want := []string{"x := 1", "", "if x > 0 {", "\tprintln(x)", "}"}
	if got := regions["demo-one"].lines; !slices.Equal(got, want) {
		t.Fatalf("region lines %q, want %q", got, want)
	}
	good := "text\n\n<!-- readme:demo-one -->\n```go\nx := 1\n\nif x > 0 {\n\tprintln(x)\n}\n```\n\n```sh\nanything\n```\n"
	if n, p := readmeCheckDoc("R.md", good, regions); n != 1 || len(p) != 0 {
		t.Errorf("good document: %d blocks, problems %q", n, p)
	}
	for name, tc := range map[string]struct{ doc, want string }{
		"no marker":      {"```go\nx := 1\n```\n", "R.md:1: ```go block without a <!-- readme:NAME -->"},
		"marker too far": {"<!-- readme:demo-one -->\n\n```go\nx := 1\n```\n", "is not right before a ```go block"},
		"unknown name":   {"<!-- readme:demo-two -->\n```go\nx := 1\n```\n", `no Go file has a region "demo-two"`},
		"line differs":   {"<!-- readme:demo-one -->\n```go\nx := 1\n\nif x > 1 {\n\tprintln(x)\n}\n```\n", "R.md:5: block \"demo-one\" differs from its region at x.go:7, first at line 3 of the block:\n  R.md: \"if x > 1 {\"\n  x.go: \"if x > 0 {\""},
		"block shorter":  {"<!-- readme:demo-one -->\n```go\nx := 1\n```\n", `"(end of block)"`},
		"unclosed":       {"<!-- readme:demo-one -->\n```go\nx := 1\n", "never closed"},
	} {
		_, p := readmeCheckDoc("R.md", tc.doc, regions)
		if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
			t.Errorf("%s: problems %q, want one containing %q", name, p, tc.want)
		}
	}
	for name, tc := range map[string]struct{ src, want string }{
		"never ends":   {"// readme:begin a\nx\n", `region "a" never ends`},
		"stray end":    {"// readme:end a\n", `end of region "a" that did not begin`},
		"nested":       {"// readme:begin a\n// readme:begin b\n// readme:end b\n// readme:end a\n", `region "b" begins inside region "a"`},
		"bad name":     {"// readme:begin Big_Name\n// readme:end Big_Name\n", `region name "Big_Name"`},
		"same file":    {"// readme:begin a\n// readme:end a\n// readme:begin a\n// readme:end a\n", `region "a" already defined`},
		"wrong closer": {"// readme:begin a\n// readme:end b\n", `end of region "b" inside region "a"`},
	} {
		_, p := readmeParseRegions("y.go", tc.src)
		if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
			t.Errorf("%s: problems %q, want one containing %q", name, p, tc.want)
		}
	}
	// Duplicates across files.
	dir := t.TempDir()
	for _, f := range []string{"a.go", "sub/b.go", "testdata/c.go"} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("package p\n// readme:begin dup\n// readme:end dup\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, p := readmeRegions(dir)
	if len(p) != 1 || !strings.Contains(p[0], `region "dup" already defined at `) {
		t.Errorf("duplicate across files (testdata skipped): problems %q, want exactly one", p)
	}
}
