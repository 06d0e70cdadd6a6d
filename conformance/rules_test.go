package conformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRulesQuoteTheSource: every sentence a case quotes appears verbatim
// in the doc comments of the file it names, so that a quote cannot drift
// from the contract.
func TestRulesQuoteTheSource(t *testing.T) {
	docs := map[string]string{}
	for _, r := range allRules {
		doc, ok := docs[r.file]
		if !ok {
			src, err := os.ReadFile(filepath.Join("..", r.file))
			if err != nil {
				t.Fatal(err)
			}
			doc = commentText(string(src))
			docs[r.file] = doc
		}
		if !strings.Contains(doc, r.text) {
			t.Errorf("%s does not say, word for word: %q", r.file, r.text)
		}
	}
}

// TestEveryCaseNamesItsRules: the cases that check a sentence of the
// contract say which; the list of cases has no duplicate names.
func TestEveryCaseNamesItsRules(t *testing.T) {
	s := &suite[struct{}]{}
	seen := map[string]bool{}
	quoted := map[rule]bool{}
	for _, c := range s.cases() {
		if seen[c.name] {
			t.Errorf("case %s listed twice", c.name)
		}
		seen[c.name] = true
		for _, r := range c.rules {
			quoted[r] = true
		}
	}
	for _, r := range allRules {
		if !quoted[r] {
			t.Errorf("no case checks %v", r)
		}
	}
}

// commentText joins the text of src's // comments into one line, words
// separated by single spaces.
func commentText(src string) string {
	var words []string
	for _, line := range strings.Split(src, "\n") {
		line = strings.TrimSpace(line)
		if text, ok := strings.CutPrefix(line, "//"); ok {
			text = strings.TrimPrefix(strings.TrimSpace(text), "- ")
			words = append(words, strings.Fields(text)...)
		}
	}
	return strings.Join(words, " ")
}
