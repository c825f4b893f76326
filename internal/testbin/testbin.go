// Package testbin gives tests the ffkit binary, so that CLI and system tests
// run the real program as a user does. scripts/test.sh builds the binary
// once and names it in FFKIT_TEST_BINARY; without it, the binary is built
// once per test process into a temporary directory (removed by Cleanup).
//
// Linking ffkit takes a while (it carries DuckDB), so building it once per
// run instead of once per test file is most of the CLI suites' time.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Env names the prebuilt binary, when set.
const Env = "FFKIT_TEST_BINARY"

var (
	once     sync.Once
	path     string
	dir      string // temporary build directory, if we built it
	buildErr string
)

// Path returns the ffkit binary, building it on first use. It fails the
// test if the binary cannot be had.
func Path(t testing.TB) string {
	t.Helper()
	p, err := Get()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Get is Path for callers without a testing.TB (TestMain).
func Get() (string, error) {
	once.Do(func() {
		if p := os.Getenv(Env); p != "" {
			if _, err := os.Stat(p); err != nil {
				buildErr = fmt.Sprintf("%s=%s: %v", Env, p, err)
				return
			}
			path = p
			return
		}
		d, err := os.MkdirTemp("", "ffkit-testbin-")
		if err != nil {
			buildErr = err.Error()
			return
		}
		dir = d
		path = filepath.Join(d, "ffkit")
		out, err := exec.Command("go", "build", "-o", path, "github.com/ffkit/ffkit/cmd/ffkit").CombinedOutput()
		if err != nil {
			buildErr = fmt.Sprintf("go build ./cmd/ffkit: %v\n%s", err, out)
		}
	})
	if buildErr != "" {
		return "", fmt.Errorf("testbin: %s", buildErr)
	}
	return path, nil
}

// Cleanup removes a binary that Get built (not one named by Env).
func Cleanup() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}
