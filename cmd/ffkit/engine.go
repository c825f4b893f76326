package main

import (
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/internal/engine"
)

// The engine subcommand is the helper process of the Python package: it is
// hidden because only Python starts it (see internal/engine).
func init() {
	register(func() *cobra.Command {
		var fd int
		c := &cobra.Command{
			Use:    "engine",
			Short:  "Serve the Python package over a socket (started by Python, not by users)",
			Hidden: true,
			Args:   cobra.NoArgs,
			RunE: func(cmd *cobra.Command, args []string) error {
				// Ctrl-C in a terminal reaches the whole process group; the
				// helper must outlive it so that Python can catch
				// KeyboardInterrupt and carry on. It ends when Python closes
				// the control connection.
				signal.Ignore(syscall.SIGINT)
				// The helper's heap is small (batches live in shared
				// memory, not on it), so the default GOGC would collect
				// every few MB of per-batch garbage: aim higher unless the
				// user chose.
				if os.Getenv("GOGC") == "" {
					debug.SetGCPercent(400)
				}
				conn, err := engine.Listen(fd)
				if err != nil {
					return err
				}
				return engine.NewServer().Serve(cmd.Context(), conn)
			},
		}
		c.Flags().IntVar(&fd, "fd", 3, "descriptor of the control socket")
		return c
	})
}
