package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

// TestStoreRefusedExit: the command refuses a bare host:port with exit
// status 2 and the list of accepted forms, and creates no file.
func TestStoreRefusedExit(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"-store", "127.0.0.1:6379"}, &out, &errb)
	if code != 2 || out.Len() != 0 {
		t.Errorf("exit %d, stdout %q; want 2 and nothing", code, out.String())
	}
	if !strings.Contains(errb.String(), `-store "127.0.0.1:6379": a bare host:port names no store; for Redis write redis://127.0.0.1:6379`) ||
		!strings.Contains(errb.String(), "accepted -store values:") {
		t.Errorf("stderr:\n%s", errb.String())
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("files created: %v", left)
	}
}
