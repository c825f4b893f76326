package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// printJSON writes v as the one JSON document on stdout.
func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// human is where human-readable results go: stdout normally, stderr when
// --json owns stdout.
func human() io.Writer {
	if jsonOut {
		return os.Stderr
	}
	return os.Stdout
}

// isTerminal reports whether stderr is a terminal (progress bars go there).
func isTerminal() bool { return term.IsTerminal(int(os.Stderr.Fd())) }

// newProgress returns a progress bar on stderr when it is a terminal, or a
// silent one otherwise. max < 0 means unknown total.
func newProgress(max int64, desc string) *progressbar.ProgressBar {
	if !isTerminal() {
		return progressbar.DefaultSilent(max, desc)
	}
	return progressbar.NewOptions64(max,
		progressbar.OptionSetWriter(os.Stderr),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionShowBytes(true),
		progressbar.OptionThrottle(100e6),
		progressbar.OptionClearOnFinish(),
	)
}

func isCobraUsage(err error) bool {
	s := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag",
		"accepts ", "requires at least", "requires at most", "received ", "invalid argument",
		"required flag", "flag needs an argument", "if any flags in the group"} {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

// warnf prints a warning on stderr.
func warnf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "ffkit: warning: "+format+"\n", args...)
}
