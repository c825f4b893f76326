package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/ffkit/ffkit/internal/engine"
)

// parentCheck is how often the engine checks that the Python process that
// started it is still its parent (the backstop to PR_SET_PDEATHSIG).
const parentCheck = 250 * time.Millisecond

// The engine subcommand is the helper process of the Python package: it is
// hidden because only Python starts it (see internal/engine).
//
// Lifecycle: the engine ends when Python closes the control connection, when
// its parent process (--parent) dies, even if forked children of Python
// still hold the control socket (PR_SET_PDEATHSIG, plus a parent check every
// parentCheck), and on SIGTERM or SIGINT; each way it aborts unfinished
// writers, so no half-written file appears under a final name.
func init() {
	register(func() *cobra.Command {
		var fd, parent int
		var schema string
		c := &cobra.Command{
			Use:    "engine",
			Short:  "Serve the Python package over a socket (started by Python, not by users)",
			Hidden: true,
			Args:   cobra.NoArgs,
			RunE: func(cmd *cobra.Command, args []string) error {
				if schema != "" {
					return writeSchema(schema)
				}
				ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
				defer stop()
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				if parent > 0 {
					if err := watchParent(ctx, cancel, parent); err != nil {
						return err
					}
				}
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
				// A signal or a dead parent ends Serve (it closes every
				// handle); should anything hang past a few seconds, exit
				// anyway rather than linger.
				context.AfterFunc(ctx, func() {
					time.Sleep(5 * time.Second)
					fmt.Fprintln(os.Stderr, "ffkit engine: did not stop within 5s of being told to; exiting")
					os.Exit(1)
				})
				return engine.NewServer().Serve(ctx, conn)
			},
		}
		c.Flags().IntVar(&fd, "fd", 3, "descriptor of the control socket")
		c.Flags().IntVar(&parent, "parent", 0, "pid of the Python process that started the engine: exit when it dies")
		c.Flags().StringVar(&schema, "schema", "", "write the protocol as a Python module to this file (python/ffkit/_protocol.py) and exit")
		return c
	})
}

// watchParent arranges for cancel to run when process parent is no longer
// this process's parent (it died: the engine was re-parented).
func watchParent(ctx context.Context, cancel context.CancelFunc, parent int) error {
	// The kernel signals us when the thread that forked us exits; that
	// may be a Python thread that ended while the process lives on, so
	// the signal (SIGUSR1, not a terminating one) only makes us look.
	look := make(chan os.Signal, 1)
	signal.Notify(look, syscall.SIGUSR1)
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGUSR1), 0, 0, 0); err != nil {
		return fmt.Errorf("ffkit engine: set the parent-death signal: %w", err)
	}
	if os.Getppid() != parent {
		return fmt.Errorf("ffkit engine: parent %d exited before the engine started", parent)
	}
	go func() {
		defer signal.Stop(look)
		t := time.NewTicker(parentCheck)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-look:
			case <-t.C:
			}
			if os.Getppid() != parent {
				cancel()
				return
			}
		}
	}()
	return nil
}

func writeSchema(path string) error {
	src, err := engine.PythonSchema()
	if err != nil {
		return err
	}
	if path == "-" {
		_, err = os.Stdout.Write(src)
		return err
	}
	return os.WriteFile(path, src, 0o644)
}
