package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-idempotency/idempotency"
	"github.com/go-idempotency/idempotency/internal/testkit"
	"github.com/go-idempotency/idempotency/sealed"
)

// newKeyHex returns a random key as its 64 hexadecimal digits.
func newKeyHex(t *testing.T) string {
	t.Helper()
	k := make([]byte, sealed.KeySize)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(k)
}

// writeKeyring writes content to a file of mode perm and returns its path.
func writeKeyring(t *testing.T, content string, perm os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keyring")
	if err := os.WriteFile(path, []byte(content), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil { // past the umask
		t.Fatal(err)
	}
	return path
}

// TestKeyringFile: the documented format is read; every mistake is
// refused as bad usage, named by its line, without a digit of a key in
// the message.
func TestKeyringFile(t *testing.T) {
	t.Parallel()
	k1, k2 := newKeyHex(t), newKeyHex(t)
	good := "# keys\n\n2026-01 " + k1 + "\n  2026-04\t" + k2 + "  \ncurrent 2026-04\n"
	kr, err := parseKeyring([]byte(good))
	if err != nil || kr.Current != "2026-04" || len(kr.Keys) != 2 || hex.EncodeToString(kr.Keys["2026-01"]) != k1 {
		t.Fatalf("parseKeyring(good) = %+v, %v", kr.Current, err)
	}
	if kr, err := parseKeyring([]byte("a " + k1 + "\nb " + k2 + "\n")); err != nil || kr.Current != "a" {
		t.Errorf("no current line: current %q, %v; want the first key", kr.Current, err)
	}
	if _, err := loadKeyring(writeKeyring(t, good, 0o600)); err != nil {
		t.Errorf("loadKeyring(0600): %v", err)
	}
	if _, err := loadKeyring(writeKeyring(t, good, 0o400)); err != nil {
		t.Errorf("loadKeyring(0400): %v", err)
	}
	bad := strings.Replace(k1, k1[10:11], "g", 1)
	for name, tc := range map[string]struct {
		content string
		perm    os.FileMode
		want    string
	}{
		"others read":     {good, 0o644, "mode 0644 lets others read or change the keys; chmod 600 it"},
		"group read":      {good, 0o640, "chmod 600 it"},
		"not hex":         {"a " + bad + "\n", 0o600, "line 1: the key is not hexadecimal"},
		"short":           {"a " + k1[:62] + "\n", 0o600, "line 1: the key is 62 characters, want 64 hexadecimal digits"},
		"three fields":    {"# c\na " + k1 + " x\n", 0o600, "line 2 has 3 fields, want 2"},
		"twice":           {"a " + k1 + "\na " + k2 + "\n", 0o600, "line 2: the key id of line 1 again"},
		"empty":           {"# nothing\n", 0o600, "no key"},
		"unknown current": {"a " + k1 + "\ncurrent b\n", 0o600, "line 2: current names a key id that no line defines"},
	} {
		_, err := loadKeyring(writeKeyring(t, tc.content, tc.perm))
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a usage error saying %q", name, err, tc.want)
			continue
		}
		for _, k := range []string{k1, k2, bad, k1[:62], k1[:16], k2[:16]} {
			if strings.Contains(err.Error(), k) {
				t.Errorf("%s: the error shows key material: %v", name, err)
			}
		}
	}
	if _, err := loadKeyring(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("a missing keyring file was accepted")
	}
	if _, err := loadKeyring(t.TempDir()); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
}

// TestInspectSealed: on every store, inspect -body shows a sealed body
// only with -keyring, says "sealed" without it (never the sealed bytes),
// and fails with status 3 when the keyring lacks the record's key.
func TestInspectSealed(t *testing.T) {
	t.Parallel()
	k1, k2 := newKeyHex(t), newKeyHex(t)
	raw, _ := hex.DecodeString(k1)
	codec, err := sealed.New(sealed.Keyring{Keys: map[string][]byte{"2026-01": raw}, Current: "2026-01"})
	if err != nil {
		t.Fatal(err)
	}
	ring := writeKeyring(t, "2026-01 "+k1+"\n", 0o600)
	otherRing := writeKeyring(t, "2027-01 "+k2+"\n", 0o600)
	const body = "card ending 4242"
	forEachStore(t, func(t *testing.T, ctx context.Context, sc storeCase) {
		key := idempotency.Key{Scope: testkit.Name("sealed-"), ID: "k"}
		if err := sc.seed.completeSealed(ctx, key, body, codec); err != nil {
			t.Fatal(err)
		}
		if _, err := sc.seed.complete(ctx, idempotency.Key{Scope: key.Scope, ID: "plain"}, "plain body", false); err != nil {
			t.Fatal(err)
		}
		cmd := func(args ...string) (int, string, string) {
			return runCmd(t, ctx, append(append([]string{}, sc.args...), args...)...)
		}
		code, out, errs := cmd("inspect", "-body", "-scope", key.Scope, "k")
		if code != 0 || !strings.Contains(out, "sealed:      yes\n") || !strings.HasSuffix(out, "\nbody: sealed (give -keyring to open it)\n") ||
			strings.Contains(out, body) {
			t.Errorf("inspect -body without -keyring: exit %d (%s):\n%s", code, errs, out)
		}
		code, out, errs = cmd("-json", "inspect", "-body", "-scope", key.Scope, "k")
		var j keyInfoJSON
		if outJSON(t, out, &j); code != 0 || !j.Sealed || j.Body != nil || j.BodySealed != sealedBody || j.Status != 201 {
			t.Errorf("-json inspect -body without -keyring: exit %d (%s): %+v", code, errs, j)
		}
		code, out, errs = cmd("inspect", "-body", "-keyring", ring, "-scope", key.Scope, "k")
		if code != 0 || !strings.Contains(out, "sealed:      yes\n") || !strings.HasSuffix(out, "\nbody:\n"+body+"\n") ||
			!strings.Contains(out, "header:      Content-Type: text/plain\n") {
			t.Errorf("inspect -body -keyring: exit %d (%s):\n%s", code, errs, out)
		}
		code, out, errs = cmd("-json", "inspect", "-body", "-keyring", ring, "-scope", key.Scope, "k")
		j = keyInfoJSON{}
		if outJSON(t, out, &j); code != 0 || !j.Sealed || string(j.Body) != body || j.BodySealed != "" {
			t.Errorf("-json inspect -body -keyring: exit %d (%s): %+v", code, errs, j)
		}
		code, out, errs = cmd("inspect", "-body", "-keyring", otherRing, "-scope", key.Scope, "k")
		if code != exitStore || out != "" || !strings.Contains(errs, "the -keyring given cannot open this record") ||
			strings.Count(errs, "idemctl:") != 1 || strings.Contains(errs, k2) {
			t.Errorf("inspect -body with another keyring: exit %d, stdout %q, stderr %q", code, out, errs)
		}
		// A record stored in clear is shown as it is, with or without a keyring.
		code, out, _ = cmd("inspect", "-body", "-keyring", ring, "-scope", key.Scope, "plain")
		if code != 0 || strings.Contains(out, "sealed") || !strings.HasSuffix(out, "\nbody:\nplain body\n") {
			t.Errorf("inspect -body -keyring of a plain record: exit %d:\n%s", code, out)
		}
		// Without -body, a sealed record says so and shows no body line.
		code, out, _ = cmd("inspect", "-scope", key.Scope, "k")
		if code != 0 || !strings.Contains(out, "sealed:      yes\n") || strings.Contains(out, "body:") {
			t.Errorf("inspect of a sealed record: exit %d:\n%s", code, out)
		}
	})
}
