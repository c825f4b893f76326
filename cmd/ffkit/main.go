// Command ffkit packs, reads, verifies, loads and benchmarks FFRecord
// datasets, runs columnar scan jobs, and runs and uses the ffkit cluster.
//
// Exit codes: 0 ok, 1 the data is bad, 2 usage error, 3 a service or file
// could not be reached, 4 any other failure.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/internal/errkind"

	_ "github.com/ffkit/ffkit/fs/localfs" // plain paths
)

// Exit codes scripts can rely on.
const (
	exitOK          = 0
	exitBadData     = 1
	exitUsage       = 2
	exitUnavailable = 3
	exitOther       = 4
)

// jsonOut is the global --json flag: stdout is exactly one JSON document.
var jsonOut bool

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "ffkit",
		Short: "ffkit: FFRecord datasets, a training data loader, columnar jobs and a chain-replicated file system",
		Long: `ffkit is a toolkit for the data path of large-scale training.

It packs samples into FFRecord files (byte-compatible with HFAiLab's FFRecord),
reads them back validated and checksummed, feeds training with exact,
resumable, rank-balanced shuffles, runs SmallPond-style columnar jobs, and
runs a bundled chain-replicated file system (ffkit:// paths).

Exit codes: 0 ok, 1 the data is bad, 2 usage error, 3 a service or file
could not be reached, 4 any other failure.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().BoolVar(&jsonOut, "json", false, "print the result as one JSON document on stdout (progress and messages go to stderr)")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%w\nRun '%s --help' for usage.", err, c.CommandPath())}
	})
	for _, add := range subcommands {
		root.AddCommand(add())
	}
	return root
}

// subcommands holds one constructor per subcommand file (init-registered).
var subcommands []func() *cobra.Command

func register(f func() *cobra.Command) { subcommands = append(subcommands, f) }

// usageError marks a mistake in the command line.
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

// usagef returns a usage error.
func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// exitCode maps an error to the documented exit codes.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var u usageError
	if errors.As(err, &u) {
		return exitUsage
	}
	switch errkind.Of(err) {
	case errkind.Data:
		return exitBadData
	case errkind.Usage:
		return exitUsage
	case errkind.Unavailable:
		return exitUnavailable
	}
	return exitOther
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	root := newRoot()
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		// Cobra reports unknown commands and bad args as plain errors.
		if isCobraUsage(err) {
			err = usageError{err}
		}
		var q quietError
		if !errors.As(err, &q) {
			fmt.Fprintf(os.Stderr, "ffkit: %v\n", err)
		}
	}
	os.Exit(exitCode(err))
}

// quietError carries an exit code for a failure already reported (verify
// lists its findings, then exits 1 without a second message).
type quietError struct{ error }

func (q quietError) Unwrap() error { return q.error }
