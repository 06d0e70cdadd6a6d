package sqlite_test

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"
)

// TestMain runs the task in childEnv when the binary is a child process of
// the tests in process_test.go, and the tests otherwise. SQLite needs no
// server, so no backend is skipped and there is no NOT RUN line.
func TestMain(m *testing.M) {
	if raw := os.Getenv(childEnv); raw != "" {
		var task childTask
		err := json.Unmarshal([]byte(raw), &task)
		if err == nil {
			err = runChild(task)
		}
		if err != nil {
			fmt.Println("error:", err)
			fmt.Fprintln(os.Stderr, "sqlite child:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
