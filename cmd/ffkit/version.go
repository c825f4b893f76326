package main

import (
	"runtime"

	"github.com/spf13/cobra"
)

func init() { register(newVersionCmd) }

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print ffkit's version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			v := map[string]string{"version": "0.1.0", "go": runtime.Version()}
			if jsonOut {
				return printJSON(v)
			}
			cmd.Printf("ffkit %s (%s)\n", v["version"], v["go"])
			return nil
		},
	}
}
