package scan

import (
	"os"
	"testing"
)

// BenchmarkJobProfile runs one job on $FFKIT_SCAN_PROFILE_DATA (for pprof).
func BenchmarkJobProfile(b *testing.B) {
	if f := os.Getenv("FFKIT_SCAN_PROFILE_JOB"); f != "" {
		// a job file as `ffkit scan --job` reads it (for example one
		// stage of a DataFrame), run as written: its output is removed
		// before each run
		data, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		GatherAcrossBatches = os.Getenv("FFKIT_SCAN_PROFILE_GATHER") != "0"
		j, err := ParseJob(f, data)
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < b.N; i++ {
			os.RemoveAll(j.Output)
			if _, err := Run(bg, j); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	in := os.Getenv("FFKIT_SCAN_PROFILE_DATA")
	if in == "" {
		b.Skip("FFKIT_SCAN_PROFILE_DATA not set")
	}
	for i := 0; i < b.N; i++ {
		out := b.TempDir() + "/o.parquet"
		j := Job{Inputs: []string{in}, Output: out}
		switch os.Getenv("FFKIT_SCAN_PROFILE_QUERY") {
		case "groupby":
			j.GroupBy, j.Aggs = []string{"category"}, "count(*), sum(key), mean(value), min(value), max(value)"
		case "groupby2":
			j.GroupBy, j.Aggs = []string{"user_id"}, "count(*), sum(key), mean(value)"
		case "pruned":
			j.Where, j.Columns = "day >= DATE '2020-12-01'", "key, day"
		case "hash":
			j.PartitionBy, j.Partitions, j.Output = "hash:key", 16, b.TempDir()+"/h"
		case "range": // a binary key column, as the GraySort bench writes
			j.PartitionBy, j.Partitions, j.Output = "range:key", 4, b.TempDir()+"/r"
			j.Bounds = [][]byte{{0x40}, {0x80}, {0xc0}}
			j.ZstdLevel = 1
		case "sort": // a directory of range partitions (part-PPPPP-*), as GraySort's
			j.PartitionBy, j.Partitions, j.Output = "parts", 8, b.TempDir()+"/s"
			j.SortBy, j.ZstdLevel = []string{"key"}, 1
		default:
			j.Where, j.Columns = "value > 0.99", "key, value"
		}
		if _, err := Run(bg, j); err != nil {
			b.Fatal(err)
		}
	}
}
