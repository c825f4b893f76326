package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ffkit/ffkit/bench"
	"github.com/ffkit/ffkit/ffrecord"
	"github.com/ffkit/ffkit/internal/errkind"
)

func init() { register(newInspectCmd) }

type inspectFile struct {
	Path      string `json:"path"`
	Samples   int64  `json:"samples"`
	Bytes     int64  `json:"bytes"`
	First     int64  `json:"first"`
	HeaderCRC string `json:"header_crc"`
	Header    string `json:"header"` // "ok", "legacy (checksum 0, not verified)" or "damaged"
	Legacy    bool   `json:"legacy"`
	// Readable: of a damaged file, how many samples (from the first) can
	// be read; Damage says what is wrong.
	Readable *int64 `json:"readable,omitempty"`
	Damage   string `json:"damage,omitempty"`
}

type inspectResult struct {
	Samples     int64         `json:"samples"`
	Files       int           `json:"files"`
	Bytes       int64         `json:"bytes"`
	DataBytes   int64         `json:"data_bytes"`
	SampleSize  sizeSummary   `json:"sample_size"`
	LegacyFiles int           `json:"legacy_files"`
	PerFile     []inspectFile `json:"per_file"`
	// DamagedFiles counts the files that are damaged (exit code 1).
	DamagedFiles int    `json:"damaged_files"`
	Fingerprint  string `json:"fingerprint"`
}

type sizeSummary struct {
	Min    int64 `json:"min"`
	Median int64 `json:"median"`
	Max    int64 `json:"max"`
}

func newInspectCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "inspect PATH...",
		Short: "Describe an FFRecord dataset: files, samples, sizes, header status",
		Long: `Describe an FFRecord dataset: one .ffr file, a directory of *.ffr files or
several of them. Prints each file's sample count, size and header status,
the totals, and the sample size min/median/max. Headers are validated as on
every open. A damaged file (a damaged header, a truncated file) is named with
what is wrong and how many of its samples can still be read, the healthy
files are described all the same, and the exit code is 1 (use 'ffkit verify'
for a full list of faults).`,
		Example: "  ffkit inspect train/\n  ffkit inspect train.ffr --json",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := ffrecord.Open(cmd.Context(), args, ffrecord.ReadOptions{AllowDamaged: true,
				Warn: func(m string) { warnf("%s", m) }})
			if err != nil {
				return err
			}
			defer r.Close()
			st := r.Stats()
			res := inspectResult{Samples: st.Samples, Files: st.Files, Bytes: st.Bytes, DataBytes: st.DataBytes,
				SampleSize:  sizeSummary{st.MinLen, st.MedianLen, st.MaxLen},
				LegacyFiles: st.Legacy, Fingerprint: r.Fingerprint().Hash}
			damaged := map[string]ffrecord.DamagedFile{}
			for _, d := range r.Damaged() {
				damaged[d.Path] = d
			}
			for _, f := range r.Files() {
				h := "ok"
				if f.Legacy {
					h = "legacy (checksum 0, not verified)"
				}
				pf := inspectFile{Path: f.Path, Samples: f.N, Bytes: f.Size, First: f.First,
					HeaderCRC: fmt.Sprintf("%08x", f.HeaderCRC), Header: h, Legacy: f.Legacy}
				if d, ok := damaged[f.Path]; ok {
					pf.Header = fmt.Sprintf("damaged: %d of %d samples readable", d.Readable, d.Samples)
					pf.Readable = &d.Readable
					pf.Damage = strings.TrimPrefix(d.Err.Error(), f.Path+": ")
					pf.HeaderCRC = ""
					res.DamagedFiles++
				}
				res.PerFile = append(res.PerFile, pf)
			}
			var bad error
			if res.DamagedFiles > 0 {
				bad = quietError{errkind.Wrap(errkind.Data, fmt.Errorf("inspect: %d damaged file(s)", res.DamagedFiles))}
			}
			if jsonOut {
				if err := printJSON(res); err != nil {
					return err
				}
				return bad
			}
			t := bench.Table{Header: []string{"file", "samples", "bytes", "first", "header"}}
			for _, f := range res.PerFile {
				t.AddRow(f.Path, fmt.Sprint(f.Samples), bench.FormatBytes(f.Bytes), fmt.Sprint(f.First), f.Header)
			}
			w := human()
			if err := t.Write(w); err != nil {
				return err
			}
			fmt.Fprintf(w, "\n%d samples in %d file(s), %s on disk (%s of samples)\n", res.Samples, res.Files,
				bench.FormatBytes(res.Bytes), bench.FormatBytes(res.DataBytes))
			fmt.Fprintf(w, "sample size: min %s, median %s, max %s\n", bench.FormatBytes(st.MinLen),
				bench.FormatBytes(st.MedianLen), bench.FormatBytes(st.MaxLen))
			fmt.Fprintf(w, "fingerprint: %s\n", res.Fingerprint)
			for _, f := range res.PerFile {
				if f.Damage != "" {
					fmt.Fprintf(w, "DAMAGED: %s (samples %d..%d): %s; %d of its %d samples readable\n",
						f.Path, f.First, f.First+f.Samples-1, f.Damage, *f.Readable, f.Samples)
				}
			}
			return bad
		},
	}
}
