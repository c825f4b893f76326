package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/internal/errkind"
)

func init() { register(newVerifyCmd) }

var errVerifyFailed = errkind.New(errkind.Data, "verify: the dataset has faults")

func newVerifyCmd() *cobra.Command {
	var workers int
	var direct bool
	c := &cobra.Command{
		Use:   "verify PATH...",
		Short: "Check every header and every sample checksum of an FFRecord dataset",
		Long: `Check every header and every sample of an FFRecord dataset (files or
directories of *.ffr) and list every fault: header checksum mismatches,
impossible structure, truncated files (naming the first damaged or missing
sample) and sample checksum mismatches, each with its file, sample index and
byte range.

Exit code 0 when all is good (a legacy file with header checksum 0 is good,
with a warning), 1 when anything is wrong.`,
		Example: "  ffkit verify train/\n  ffkit verify train.ffr --workers 16 --json",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if workers <= 0 {
				return usagef("--workers must be positive, got %d", workers)
			}
			bar := newProgress(-1, "verify")
			rep, err := ffrecord.Verify(cmd.Context(), args, ffrecord.VerifyOptions{
				Workers: workers, Direct: direct, Progress: func(b int64) { bar.Add64(b) }})
			bar.Finish()
			if err != nil {
				return err
			}
			for _, f := range rep.Files {
				if f.Legacy {
					warnf("%s: header checksum is 0 (legacy file): header not verified, sample checksums were", f.Path)
				}
			}
			if jsonOut {
				if err := printJSON(rep); err != nil {
					return err
				}
			} else {
				w := human()
				for _, f := range rep.Faults {
					fmt.Fprintln(w, formatFault(f))
				}
				if rep.OK {
					fmt.Fprintf(w, "ok: %d samples in %d file(s) verified (%s)\n", rep.Checked, len(rep.Files), bench.FormatBytes(rep.Bytes))
				} else {
					unknown := ""
					if rep.Unknown > 0 {
						unknown = fmt.Sprintf(" and %d file(s) whose sample count is unreadable", rep.Unknown)
					}
					fmt.Fprintf(w, "FAILED: %d fault(s); %d of %d samples%s verified good in %d file(s)\n",
						len(rep.Faults), rep.Checked, rep.Samples, unknown, len(rep.Files))
				}
			}
			if !rep.OK {
				return quietError{errVerifyFailed}
			}
			return nil
		},
	}
	c.Flags().IntVar(&workers, "workers", 4, "bounds the sample reads in flight (at least 1)")
	c.Flags().BoolVar(&direct, "direct", false, "read with O_DIRECT (bypass the page cache)")
	return c
}

func formatFault(f ffrecord.Fault) string {
	where := f.Path
	switch {
	case f.Local >= 0 && f.Index >= 0 && f.Index != f.Local:
		where += fmt.Sprintf(": sample %d (sample %d of the file)", f.Index, f.Local)
	case f.Local >= 0:
		where += fmt.Sprintf(": sample %d", f.Local)
	}
	if f.Local >= 0 && f.Len > 0 {
		where += fmt.Sprintf(", bytes [%d, %d)", f.Off, f.Off+f.Len)
	}
	return fmt.Sprintf("%s: %s: %s", where, f.Kind, f.Message)
}
