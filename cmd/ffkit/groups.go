package main

import "github.com/spf13/cobra"

// The command groups. Subcommand files add themselves with registerBench
// and registerFS from their init functions.

var benchSubcommands, fsSubcommands []func() *cobra.Command

func registerBench(f func() *cobra.Command) { benchSubcommands = append(benchSubcommands, f) }
func registerFS(f func() *cobra.Command)    { fsSubcommands = append(fsSubcommands, f) }

func init() {
	register(func() *cobra.Command {
		c := &cobra.Command{
			Use:   "bench",
			Short: "Benchmarks that print ffkit's figure next to a same-run baseline",
			Long: `Benchmarks of datasets and storage. Every benchmark measures a baseline in
the same run (a plain pread loop, fio on the same device, plain TCP on
loopback) and prints ffkit's figure, the baseline's, and their ratio.`,
		}
		for _, f := range benchSubcommands {
			c.AddCommand(f())
		}
		return c
	})
	register(func() *cobra.Command {
		c := &cobra.Command{
			Use:   "fs",
			Short: "Run and use the ffkit chain-replicated file system (ffkit:// paths)",
		}
		for _, f := range fsSubcommands {
			c.AddCommand(f())
		}
		return c
	})
}
