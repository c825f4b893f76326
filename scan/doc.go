// Package scan runs SmallPond-style columnar jobs over Parquet files.
package scan

import "runtime"

func defaultWorkers() int { return runtime.NumCPU() }
