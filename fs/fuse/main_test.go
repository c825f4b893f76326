package fuse_test

import (
	"os"
	"testing"

	"github.com/ffkit/ffkit/internal/testbin"
)

// TestMain removes the ffkit binary that the tests built (see testbin).
func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}
