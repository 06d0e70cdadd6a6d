package conformance

import (
	"os"
	"strings"
	"testing"
)

// TestSchemaRuleQuotesTheSource: the sentence SchemaCheck quotes appears
// verbatim in the doc comments of keystore.go.
func TestSchemaRuleQuotesTheSource(t *testing.T) {
	src, err := os.ReadFile("../" + ruleSchemaCheck.file)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(commentText(string(src)), ruleSchemaCheck.text) {
		t.Errorf("%s does not say, word for word: %q", ruleSchemaCheck.file, ruleSchemaCheck.text)
	}
}
