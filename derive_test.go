package idempotency_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/backend"
)

// referenceDerive spells out the encoding documented on Key.Derive, byte by
// byte, independently of the implementation.
func referenceDerive(scope, id string, purpose ...string) string {
	var b bytes.Buffer
	b.WriteString("go-idempotency/derive/v1")
	b.Write(binary.BigEndian.AppendUint64(nil, uint64(len(scope))))
	b.WriteString(scope)
	b.Write(binary.BigEndian.AppendUint64(nil, uint64(len(id))))
	b.WriteString(id)
	b.Write(binary.BigEndian.AppendUint64(nil, uint64(len(purpose))))
	for _, p := range purpose {
		b.Write(binary.BigEndian.AppendUint64(nil, uint64(len(p))))
		b.WriteString(p)
	}
	sum := sha256.Sum256(b.Bytes())
	return strings.ToLower(strings.TrimRight(base32.StdEncoding.EncodeToString(sum[:]), "="))
}

// Golden values, checked against an independent implementation (Python's
// hashlib, struct and base64) of the documented encoding. A change here breaks every provider's deduplication of
// retries that straddle an upgrade, so they must never change.
var deriveGolden = []struct {
	key     idempotency.Key
	purpose []string
	want    string
}{
	{idempotency.Key{Scope: "customer-42", ID: "3f9c2a"}, []string{"charge"}, "f3hb27in4i3x4f6qkjjvkauiwztkqjmh3of7icv3hd633njexrvq"},
	{idempotency.Key{Scope: "", ID: "a"}, nil, "5gsoxejldu5bkvx7paru2wb5twnlthjjuhcxhfcinwyyouom7poq"},
	{idempotency.Key{Scope: "tenant-ü", ID: "order 7"}, []string{"step", "3"}, "7uh3zfiatma2bebipl7rz7ivet3b4vb4wzf3z5rf4dp5kpcclvea"},
}

func TestDeriveGolden(t *testing.T) {
	for _, g := range deriveGolden {
		got := g.key.Derive(g.purpose...)
		if ref := referenceDerive(g.key.Scope, g.key.ID, g.purpose...); got != ref {
			t.Errorf("%+v %q: Derive = %q, the documented encoding gives %q", g.key, g.purpose, got, ref)
		}
		if got != g.want {
			t.Errorf("%+v %q: Derive = %q, want the golden %q", g.key, g.purpose, got, g.want)
		}
	}
}

// TestDeriveOtherProcess derives the same keys in a second process (this
// test binary run again) and compares.
func TestDeriveOtherProcess(t *testing.T) {
	if os.Getenv("IDEMPOTENCY_DERIVE_CHILD") == "1" {
		for _, g := range deriveGolden {
			fmt.Println(g.key.Derive(g.purpose...))
		}
		return
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestDeriveOtherProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), "IDEMPOTENCY_DERIVE_CHILD=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child process: %v\n%s", err, out)
	}
	lines := strings.Split(string(out), "\n")
	for i, g := range deriveGolden {
		if i >= len(lines) || lines[i] != g.want {
			t.Fatalf("child process derived\n%s\nwant line %d = %q", out, i, g.want)
		}
	}
}

func TestDeriveDistinct(t *testing.T) {
	// Pairs of inputs that a careless encoding (concatenation, a separator
	// character) would merge.
	type in struct {
		scope, id string
		purpose   []string
	}
	cases := []in{
		{"ab", "c", []string{"charge"}},
		{"a", "bc", []string{"charge"}},
		{"", "abc", []string{"charge"}},
		{"abc", "", []string{"charge"}},
		{"a", "b", []string{"c", "d"}},
		{"a", "b", []string{"cd"}},
		{"a", "b", []string{"c", "", "d"}},
		{"a", "b", []string{"c", "d", ""}},
		{"a", "b", []string{"c\x00d"}},
		{"a", "b", []string{"c:d"}},
		{"a", "b:c", []string{"d"}},
		{"a:b", "c", []string{"d"}},
		{"a", "b", nil},
		{"a", "b", []string{""}},
		{"a", "b", []string{"", ""}},
		{"a", "b", []string{"charge"}},
		{"a", "b", []string{"Charge"}},
		{"a", "B", []string{"charge"}},
		{"A", "b", []string{"charge"}},
		{"tenant-1", "key", []string{"charge"}},
		{"tenant-2", "key", []string{"charge"}},
		{"tenant-1", "key", []string{"email"}},
		{"tenant-1", "key", []string{"step", "1"}},
		{"tenant-1", "key", []string{"step", "2"}},
		{"tenant-1", "key", []string{"step", "12"}},
		{"tenant-1", "key", []string{"step1"}},
	}
	seen := map[string]int{}
	for i, c := range cases {
		got := idempotency.Key{Scope: c.scope, ID: c.id}.Derive(c.purpose...)
		if j, dup := seen[got]; dup {
			t.Errorf("case %d %+v and case %d %+v both derive %q", i, c, j, cases[j], got)
		}
		seen[got] = i
		if again := (idempotency.Key{Scope: c.scope, ID: c.id}).Derive(c.purpose...); again != got {
			t.Errorf("case %d: second call gave %q, first %q", i, again, got)
		}
	}
}

func TestDeriveShapeAndUniqueness(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	randString := func(max int) string {
		b := make([]byte, r.IntN(max+1))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return string(b)
	}
	const n = 50000
	seen := make(map[string]string, n)
	for i := range n {
		// Every input is distinct: i is one of the purposes.
		k := idempotency.Key{Scope: randString(8), ID: randString(300)}
		purpose := []string{randString(4), strconv.Itoa(i)}
		got := k.Derive(purpose...)
		if len(got) != backend.DerivedKeyLen {
			t.Fatalf("len(%q) = %d, want %d", got, len(got), backend.DerivedKeyLen)
		}
		for j := 0; j < len(got); j++ {
			if c := got[j]; !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
				t.Fatalf("%q: byte %d is %q, outside [a-z2-7]", got, j, c)
			}
		}
		if err := (idempotency.Key{ID: got}).Validate(); err != nil {
			t.Fatalf("derived %q is not a valid key id: %v", got, err)
		}
		if prev, dup := seen[got]; dup {
			t.Fatalf("%q derived twice (%q and input %d)", got, prev, i)
		}
		seen[got] = strconv.Itoa(i)
	}
}

func BenchmarkDerive(b *testing.B) {
	k := idempotency.Key{Scope: "customer-42", ID: "01J9Z7Q4M6B8X2N5R3T1V0W9YH"}
	for b.Loop() {
		_ = k.Derive("charge")
	}
}

// A payment operation calls a provider that deduplicates on its own
// Idempotency-Key: it sends a key derived from the operation's key, so
// every retry of the operation (in any process) sends the same one, and the
// refund it may issue later gets another.
func ExampleKey_Derive() {
	key := idempotency.Key{Scope: "customer-42", ID: "3f9c2a"}

	// readme:begin derived-keys-example
	// Inside fn: the same operation key gives the same provider key on every
	// attempt and in every process.
	chargeKey := key.Derive("charge")
	refundKey := key.Derive("refund")
	stepKey := key.Derive("step", strconv.Itoa(3))
	// req.Header.Set("Idempotency-Key", chargeKey)
	// readme:end derived-keys-example

	fmt.Println(chargeKey)
	fmt.Println(len(chargeKey), chargeKey == key.Derive("charge"), chargeKey != refundKey, stepKey != chargeKey)
	// Output:
	// f3hb27in4i3x4f6qkjjvkauiwztkqjmh3of7icv3hd633njexrvq
	// 52 true true true
}
