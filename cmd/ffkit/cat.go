package main

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/ffrecord"
)

func init() { register(newCatCmd) }

func newCatCmd() *cobra.Command {
	var noVerify bool
	c := &cobra.Command{
		Use:   "cat PATH INDEX...",
		Short: "Write samples' raw bytes to stdout",
		Long: `Write the listed samples' raw bytes to stdout, in the given order, with
nothing between them. INDEX is a global sample index or a range A:B (A
included, B excluded; A defaults to 0 and B to the number of samples).
Checksums are verified unless --no-verify. A sample that cannot be read is
named by its global index and its index in its file; samples of the healthy
files of a dataset with a damaged file are written as usual.`,
		Example: "  ffkit cat train.ffr 0 > first.bin\n  ffkit cat train/ 10:20 3 3 > some.bin",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if jsonOut {
				return usagef("cat writes the samples' raw bytes; --json does not apply")
			}
			// Samples of healthy files stay readable when another file of
			// the dataset is damaged.
			r, err := ffrecord.Open(cmd.Context(), args[:1], ffrecord.ReadOptions{NoVerify: noVerify, AllowDamaged: true,
				Warn: func(m string) { warnf("%s", m) }})
			if err != nil {
				return err
			}
			defer r.Close()
			idx, err := parseCatIndices(args[1:], r.N())
			if err != nil {
				return err
			}
			out := bufio.NewWriterSize(os.Stdout, 1<<20)
			// In chunks, so that a long range does not load the dataset into memory.
			const maxChunkBytes = 64 << 20
			for len(idx) > 0 {
				var bytes int64
				k := 0
				for k < len(idx) && (k == 0 || bytes < maxChunkBytes) {
					_, _, l, _ := r.Locate(idx[k])
					bytes += l
					k++
				}
				samples, err := r.ReadBatch(cmd.Context(), idx[:k])
				if err != nil {
					return err
				}
				for _, s := range samples {
					if _, err := out.Write(s); err != nil {
						return err
					}
				}
				idx = idx[k:]
			}
			return out.Flush()
		},
	}
	c.Flags().BoolVar(&noVerify, "no-verify", false, "skip the sample checksum checks")
	return c
}

// parseCatIndices parses indices and A:B ranges against a dataset of n samples.
func parseCatIndices(args []string, n int64) ([]int64, error) {
	var out []int64
	for _, a := range args {
		lo, hi, isRange := strings.Cut(a, ":")
		if !isRange {
			i, err := strconv.ParseInt(a, 10, 64)
			if err != nil {
				return nil, usagef("bad index %q: want a number or a range A:B", a)
			}
			if i < 0 || i >= n {
				return nil, usagef("index %d out of range: the dataset has %d samples", i, n)
			}
			out = append(out, i)
			continue
		}
		from, to := int64(0), n
		var err error
		if lo != "" {
			if from, err = strconv.ParseInt(lo, 10, 64); err != nil {
				return nil, usagef("bad range %q: want A:B with numbers", a)
			}
		}
		if hi != "" {
			if to, err = strconv.ParseInt(hi, 10, 64); err != nil {
				return nil, usagef("bad range %q: want A:B with numbers", a)
			}
		}
		if from < 0 || to > n || from > to {
			return nil, usagef("range %s out of bounds: the dataset has %d samples", a, n)
		}
		if int64(len(out))+(to-from) > 1<<31 {
			return nil, usagef("range %s is too long for one command", a)
		}
		for i := from; i < to; i++ {
			out = append(out, i)
		}
	}
	return out, nil
}
