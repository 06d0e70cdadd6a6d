package main

import (
	"bytes"
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSelectServers(t *testing.T) {
	for only, want := range map[string][]string{
		"":                {"postgres", "mysql", "redis"},
		"redis":           {"redis"},
		"postgres, mysql": {"postgres", "mysql"},
	} {
		got, err := selectServers(only)
		if err != nil {
			t.Errorf("selectServers(%q): %v", only, err)
			continue
		}
		var names []string
		for _, s := range got {
			names = append(names, s.name)
		}
		if !slices.Equal(names, want) {
			t.Errorf("selectServers(%q) = %v, want %v", only, names, want)
		}
	}
	if _, err := selectServers("postgres,oracle"); err == nil || !strings.Contains(err.Error(), `"oracle"`) {
		t.Errorf("selectServers(oracle): err = %v, want one naming it", err)
	}
}

// TestEnvNames pins the variables printed to the ones the tests read.
func TestEnvNames(t *testing.T) {
	want := map[string]string{
		"postgres": "IDEMPOTENCY_POSTGRES_DSN",
		"mysql":    "IDEMPOTENCY_MYSQL_DSN",
		"redis":    "IDEMPOTENCY_REDIS_ADDR",
	}
	for _, s := range servers() {
		if s.env != want[s.name] {
			t.Errorf("%s: env %q, want %q", s.name, s.env, want[s.name])
		}
	}
}

// TestNoDocker: without a Docker engine the command fails with the
// provider's error and prints no export line. It is skipped where Docker
// may be, since it would start a container there.
func TestNoDocker(t *testing.T) {
	if _, err := os.Stat("/var/run/docker.sock"); err == nil || os.Getenv("DOCKER_HOST") != "" {
		t.Skip("Docker may answer here: this test is for machines without it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	err := run(ctx, []string{"-only", "redis", "-timeout", "30s"}, &out, &errb)
	if err == nil {
		t.Fatal("run returned nil without Docker")
	}
	if out.Len() != 0 {
		t.Errorf("printed %q with no server started", out.String())
	}
	if !strings.Contains(err.Error(), "redis") {
		t.Errorf("error %q does not name the server", err)
	}
}
