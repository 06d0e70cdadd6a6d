package conformance

import (
	"fmt"
	"strings"
	"testing"
)

// fakeT records what scenarioWith reports.
type fakeT struct {
	logs, errs, skips []string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Logf(format string, args ...any) {
	f.logs = append(f.logs, fmt.Sprintf(format, args...))
}
func (f *fakeT) Errorf(format string, args ...any) {
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}
func (f *fakeT) Skipf(format string, args ...any) {
	f.skips = append(f.skips, fmt.Sprintf(format, args...))
}
func (f *fakeT) Failed() bool { return len(f.errs) > 0 }

// TestKnownStepsSkip: a step that never fires fails its scenario after
// three attempts, unless the harness declares it known: then it is tried
// once and skipped with the harness's reason (an HTTP/2 SETTINGS
// acknowledgement of a gRPC client, sent once per connection).
func TestKnownStepsSkip(t *testing.T) {
	st := faultStep{label: "reserve#3", head: "....SETTINGS-ACK"}
	never := func(n *int) func() (FaultResult, bool) {
		return func() (FaultResult, bool) { *n++; return FaultResult{}, false }
	}

	var plain fakeT
	var tries int
	(&faultSuite[struct{}]{}).scenarioWith(&plain, st, never(&tries))
	if tries != 3 || len(plain.errs) != 1 || !strings.Contains(plain.errs[0], "never fired at reserve#3") || len(plain.skips) != 0 {
		t.Fatalf("an undeclared step that never fires: %d attempts, errors %q, skips %q; want 3 attempts and one 'never fired' error", tries, plain.errs, plain.skips)
	}

	const why = "HTTP/2 SETTINGS acknowledgement: sent once per connection"
	s := &faultSuite[struct{}]{h: FaultHarness[struct{}]{KnownSteps: func(step, head string) string {
		if step == "reserve#3" && strings.Contains(head, "SETTINGS") {
			return why
		}
		return ""
	}}}
	var known fakeT
	tries = 0
	s.scenarioWith(&known, st, never(&tries))
	if tries != 1 || len(known.errs) != 0 || len(known.skips) != 1 || !strings.Contains(known.skips[0], why) {
		t.Fatalf("a declared step that never fires: %d attempts, errors %q, skips %q; want 1 attempt and a skip with the reason", tries, known.errs, known.skips)
	}

	// A known step that fires is checked as any other.
	var fired fakeT
	tries = 0
	if _, ok := s.scenarioWith(&fired, st, func() (FaultResult, bool) { tries++; return FaultResult{Step: st.label}, true }); !ok || tries != 1 || len(fired.skips) != 0 {
		t.Fatalf("a declared step that fires: ok %v after %d attempts, skips %q; want it run", ok, tries, fired.skips)
	}
	// Another step is not covered by the declaration.
	var other fakeT
	tries = 0
	s.scenarioWith(&other, faultStep{label: "complete#1", head: "EVAL"}, never(&tries))
	if tries != 3 || len(other.errs) != 1 {
		t.Fatalf("an undeclared step next to a declared one: %d attempts, errors %q; want 3 and a failure", tries, other.errs)
	}
}
