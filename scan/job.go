package scan

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"golang.org/x/sync/errgroup"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/internal/errkind"
	"github.com/ffkit/ffkit/scan/expr"
)

// Key-value metadata written into every Parquet output file.
const (
	KeyFingerprint = "ffkit.fingerprint" // the job fingerprint
	KeyPartition   = "ffkit.partition"   // partition index of the file
	KeyPartitions  = "ffkit.partitions"  // number of partitions
	KeyPartitionBy = "ffkit.partition_by"
	KeyTask        = "ffkit.task"
)

// WorkDirName is the directory inside a directory output where a job keeps
// its fingerprint, task markers, staging and shuffle files.
const WorkDirName = "_ffkit"

// Job is one scan job: read -> partition -> transform -> write.
type Job struct {
	// Inputs are Parquet files, globs (wildcards in the last element) and
	// directories (searched for *.parquet), local paths or ffkit:// URLs.
	Inputs []string `json:"inputs"`
	// JoinInputs, with SQL and hash partitioning, is a second input that is
	// hash-partitioned by the same columns into the same partitions; the
	// query sees it as the table input2 (SmallPond's partial SQL join).
	JoinInputs []string `json:"join,omitempty"`
	// Broadcast: the query sees all of JoinInputs as input2 in every
	// partition (a small side joined to each partition of a big one).
	// Without it, PartitionBy "parts" gives input2 the same partition of
	// the join input (co-partitioned), and "hash:"/"column:" shuffle it
	// alike.
	Broadcast bool `json:"broadcast,omitempty"`
	// Columns is the output select list: columns and computed expressions
	// with optional AS names ("a, b, x * 2 AS y"). Empty: every column.
	Columns string `json:"columns,omitempty"`
	// Where is a SQL boolean filter. Empty: keep every row.
	Where string `json:"where,omitempty"`
	// GroupBy and Aggs ("count(*), sum(x), min(y), max(y), mean(x)")
	// aggregate the whole input into one row per group.
	GroupBy []string `json:"group_by,omitempty"`
	Aggs    string   `json:"aggs,omitempty"`
	// SQL runs through DuckDB once per partition, with the partition as the
	// table input. It excludes Columns, Where, GroupBy and Aggs.
	SQL string `json:"sql,omitempty"`
	// SortBy sorts the rows of each partition by these columns, ascending,
	// NULLs last (SmallPond's partial_sort): natively for one string,
	// binary or integer column, else as SQL's SELECT * ... ORDER BY (see
	// sort.go). It excludes SQL, Columns, Where, GroupBy, Aggs and hash:
	// and column: partitioning. With range: partitioning the job is a
	// range repartition and a partial sort in one (rangesort.go): the
	// same output files, without the intermediate stage.
	SortBy []string `json:"sort_by,omitempty"`
	// PartitionBy: "" (one partition), "files", "rows", "hash:COL[,COL...]",
	// "column:COL" (an integer column holding each row's partition, in
	// [0, Partitions): SmallPond's repartition(n, by=COL)), or "range:COL"
	// (a string or binary column, split at Bounds).
	PartitionBy string `json:"partition_by,omitempty"`
	// Bounds, with "range:COL", are the Partitions-1 ascending split points:
	// a row goes to the number of bounds <= its key (bytewise), so partition
	// p holds [Bounds[p-1], Bounds[p]); a NULL key goes to partition 0.
	// (JSON: base64 strings.)
	Bounds [][]byte `json:"bounds,omitempty"`
	// Partitions is N for PartitionBy. Default 1.
	Partitions int `json:"partitions,omitempty"`
	// Workers bounds parallel tasks and row-group decoding. Default: CPUs.
	Workers int `json:"workers,omitempty"`
	// Output is a directory of part files, or one file when it ends in the
	// format's extension (.parquet, .csv, .jsonl, .arrow).
	Output string `json:"output,omitempty"`
	// Format: parquet (default), ffrecord, csv, jsonl, arrow (Arrow IPC file).
	Format string `json:"format,omitempty"`
	// SampleColumn is the binary/string column whose bytes become one
	// FFRecord sample per row (Format ffrecord).
	SampleColumn string `json:"sample_column,omitempty"`
	// ShardSize is the target FFRecord shard size. Default 256 MiB.
	ShardSize int64 `json:"shard_size,omitempty"`
	// ZstdLevel is the zstd level of Parquet output, 1 (fastest) to 22.
	// Default 3. Intermediate shuffle files are always written at 1.
	ZstdLevel int `json:"zstd_level,omitempty"`
	// Compression of Parquet output: zstd (default), snappy, lz4 (LZ4_RAW)
	// or none. A DataFrame's repartition stages and SQL shuffle files,
	// read once by the next step, are written uncompressed.
	Compression string `json:"compression,omitempty"`
	// RowGroupRows is the Parquet output row-group length. Default 122880.
	RowGroupRows int64 `json:"row_group_rows,omitempty"`
	// MemoryLimit caps DuckDB's memory per SQL task ("2GB"). Default 1GB.
	MemoryLimit string `json:"memory_limit,omitempty"`
	// Retries is how many times a failed task is retried. Default 2.
	Retries int `json:"retries,omitempty"`
	// Salt, if set, is mixed into the job's fingerprint. A Plan sets it to
	// the fingerprints of the stages a stage reads, so the stage runs again
	// whenever one of them did.
	Salt string `json:"salt,omitempty"`
	// Progress, if set, is called with rows processed and rows planned. It
	// is called from one goroutine at a time.
	Progress func(done, total int64) `json:"-"`
}

// Summary reports what a job did.
type Summary struct {
	Fingerprint      string `json:"fingerprint"`
	Output           string `json:"output"`
	InputFiles       int    `json:"input_files"`
	RowsIn           int64  `json:"rows_in"`
	RowsOut          int64  `json:"rows_out"`
	BytesRead        int64  `json:"bytes_read"`
	RowGroups        int    `json:"row_groups"`
	RowGroupsSkipped int    `json:"row_groups_skipped"`
	// PagesSkipped counts pages a page index ruled out inside row groups
	// that were read.
	PagesSkipped int64    `json:"pages_skipped"`
	Partitions   int      `json:"partitions"`
	Tasks        int      `json:"tasks"`
	TasksSkipped int      `json:"tasks_skipped"`
	Retries      int      `json:"retries"`
	OutputFiles  []string `json:"output_files"`
	Seconds      float64  `json:"seconds"`
	// UpToDate: the output was already published by the same job.
	UpToDate bool `json:"up_to_date"`
}

func (j *Job) fill() {
	if j.Format == "" {
		j.Format = FormatParquet
	}
	if j.Partitions <= 0 {
		j.Partitions = 1
	}
	if j.Workers <= 0 {
		j.Workers = defaultWorkers()
	}
	if j.MemoryLimit == "" {
		j.MemoryLimit = "1GB"
	}
	if j.Retries == 0 {
		j.Retries = 2
	} else if j.Retries < 0 {
		j.Retries = 0
	}
	if j.RowGroupRows <= 0 {
		j.RowGroupRows = DefaultRowGroupRows
	}
}

// keyColumns parses the columns of "hash:a,b" and "column:c".
func (j *Job) keyColumns() []string {
	var list string
	if h, ok := strings.CutPrefix(j.PartitionBy, "hash:"); ok {
		list = h
	} else if c, ok := strings.CutPrefix(j.PartitionBy, "column:"); ok {
		list = c
	} else if c, ok := strings.CutPrefix(j.PartitionBy, "range:"); ok {
		list = c
	} else {
		return nil
	}
	var out []string
	for _, c := range strings.Split(list, ",") {
		if c = strings.TrimSpace(c); c != "" {
			out = append(out, c)
		}
	}
	return out
}

// byValue: rows go to the partition their key column holds ("column:COL").
func (j *Job) byValue() bool { return strings.HasPrefix(j.PartitionBy, "column:") }

// byRange: rows go to the partition of their key between Bounds ("range:COL").
func (j *Job) byRange() bool { return strings.HasPrefix(j.PartitionBy, "range:") }

// Validate checks the job's options.
func (j *Job) Validate() error {
	if len(j.Inputs) == 0 {
		return fmt.Errorf("%w: no inputs", ErrUsage)
	}
	if j.Output == "" {
		return fmt.Errorf("%w: no output (-o)", ErrUsage)
	}
	switch j.Format {
	case FormatParquet, FormatCSV, FormatJSONL, FormatArrow, FormatFFRecord, "":
	default:
		return fmt.Errorf("%w: unknown format %q (want parquet, ffrecord, csv, jsonl or arrow)", ErrUsage, j.Format)
	}
	switch {
	case j.PartitionBy == "", j.PartitionBy == "files", j.PartitionBy == "rows", j.PartitionBy == "parts":
	case strings.HasPrefix(j.PartitionBy, "hash:"):
		if len(j.keyColumns()) == 0 {
			return fmt.Errorf("%w: --partition-by hash: needs columns (hash:COL[,COL...])", ErrUsage)
		}
	case j.byValue():
		if len(j.keyColumns()) != 1 {
			return fmt.Errorf("%w: --partition-by %q: column: takes one integer column (column:COL)", ErrUsage, j.PartitionBy)
		}
	case j.byRange():
		if len(j.keyColumns()) != 1 {
			return fmt.Errorf("%w: --partition-by %q: range: takes one string or binary column (range:COL)", ErrUsage, j.PartitionBy)
		}
		if len(j.Bounds) != max(j.Partitions, 1)-1 {
			return fmt.Errorf("%w: --partition-by %s into %d partitions needs %d bounds, got %d", ErrUsage, j.PartitionBy, max(j.Partitions, 1), max(j.Partitions, 1)-1, len(j.Bounds))
		}
		for i := 1; i < len(j.Bounds); i++ {
			if bytes.Compare(j.Bounds[i-1], j.Bounds[i]) > 0 {
				return fmt.Errorf("%w: --partition-by %s: bounds %d and %d are not in ascending order", ErrUsage, j.PartitionBy, i-1, i)
			}
		}
	default:
		return fmt.Errorf("%w: --partition-by %q: want files, rows, parts, hash:COL[,COL...], column:COL or range:COL", ErrUsage, j.PartitionBy)
	}
	if len(j.Bounds) > 0 && !j.byRange() {
		return fmt.Errorf("%w: bounds need --partition-by range:COL", ErrUsage)
	}
	switch j.Compression {
	case "", "zstd", "snappy", "lz4", "none":
	default:
		return fmt.Errorf("%w: compression %q: want zstd, snappy, lz4 or none", ErrUsage, j.Compression)
	}
	if j.ZstdLevel < 0 || j.ZstdLevel > 22 {
		return fmt.Errorf("%w: zstd_level %d out of range [1, 22]", ErrUsage, j.ZstdLevel)
	}
	if j.Partitions < 0 || j.Partitions > 1<<16 {
		return fmt.Errorf("%w: --partitions %d out of range [1, 65536]", ErrUsage, j.Partitions)
	}
	if j.Partitions > 1 && j.PartitionBy == "" {
		return fmt.Errorf("%w: --partitions needs --partition-by", ErrUsage)
	}
	if len(j.SortBy) > 0 && (j.SQL != "" || j.Columns != "" || j.Where != "" || len(j.GroupBy) > 0 || j.Aggs != "" || (len(j.keyColumns()) > 0 && !j.byRange()) || len(j.JoinInputs) > 0) {
		return fmt.Errorf("%w: sort_by sorts each partition of the input as it is (or of its range: partitions): it cannot be combined with sql, columns, where, group_by, aggs, a join or hash: or column: partitioning", ErrUsage)
	}
	if j.SQL != "" && (j.Columns != "" || j.Where != "" || len(j.GroupBy) > 0 || j.Aggs != "") {
		return fmt.Errorf("%w: --sql cannot be combined with --columns, --where, --group-by or --agg: write them in the query", ErrUsage)
	}
	if (len(j.GroupBy) > 0 || j.Aggs != "") && j.Columns != "" {
		return fmt.Errorf("%w: --columns cannot be combined with --group-by/--agg (the output is the keys then the aggregates)", ErrUsage)
	}
	if len(j.GroupBy) > 0 && j.Aggs == "" {
		return fmt.Errorf("%w: --group-by needs --agg", ErrUsage)
	}
	if len(j.JoinInputs) > 0 && j.SQL == "" {
		return fmt.Errorf("%w: a join input needs --sql (the query sees it as input2)", ErrUsage)
	}
	if j.Broadcast && (len(j.JoinInputs) == 0 || len(j.keyColumns()) > 0) {
		return fmt.Errorf("%w: broadcast needs a join input and no hash: or column: partitioning", ErrUsage)
	}
	if j.Format == FormatFFRecord && j.SampleColumn == "" {
		return fmt.Errorf("%w: --format ffrecord needs --sample-column", ErrUsage)
	}
	return nil
}

type marker struct {
	Fingerprint string   `json:"fingerprint"`
	Task        string   `json:"task"`
	Files       []string `json:"files"`
	Rows        int64    `json:"rows"`
}

type runner struct {
	job       Job
	src, src2 *Source
	q         *query // native transform (nil with SQL)
	agg       *aggPlan
	fp        string
	fsys      fs.FS
	single    bool // Output is one file
	// direct: a single-file Parquet output made by one task; the output
	// file's fingerprint is the only record needed (no job.json, markers)
	direct     bool
	outDir     string // user-form directory the part files are published in
	work       string // user-form work directory
	partitions int
	sql        *sqlRunner
	// with SortBy: the read column of the native sort (-1: DuckDB sorts)
	// and DuckDB's query
	sortKey int
	sortSQL string
	// sel, set by RunTask and PendingTasks, runs at most one task and
	// lists the others instead of running them
	sel *selector

	mu       sync.Mutex
	sum      Summary
	planned  int64
	done     int64
	progress func(done, total int64)
}

// Run runs a job to completion. A rerun of the same job (same inputs,
// query and options) skips the tasks whose output is already published.
func Run(ctx context.Context, job Job) (*Summary, error) {
	return run(ctx, job, nil)
}

func run(ctx context.Context, job Job, sel *selector) (*Summary, error) {
	start := time.Now()
	job.fill()
	if err := job.Validate(); err != nil {
		return nil, err
	}
	r := &runner{job: job, partitions: job.Partitions, progress: job.Progress, sel: sel}
	var err error
	if r.src, err = OpenSource(ctx, job.Inputs, job.Workers); err != nil {
		return nil, err
	}
	defer r.src.Close()
	if len(job.JoinInputs) > 0 {
		if r.src2, err = OpenSource(ctx, job.JoinInputs, job.Workers); err != nil {
			return nil, err
		}
		defer r.src2.Close()
	}
	if err := r.compile(); err != nil {
		return nil, err
	}
	if r.fp, err = r.fingerprint(ctx); err != nil {
		return nil, err
	}
	r.sum.Fingerprint = r.fp
	r.sum.Output = job.Output
	r.sum.InputFiles = len(r.src.Files)
	r.sum.RowsIn = r.src.Rows()
	r.sum.Partitions = r.partitions
	if r.src2 != nil {
		r.sum.InputFiles += len(r.src2.Files)
		r.sum.RowsIn += r.src2.Rows()
	}
	upToDate, err := r.prepareOutput(ctx)
	if err != nil {
		return nil, err
	}
	if upToDate {
		r.sum.UpToDate = true
		r.sum.OutputFiles = []string{job.Output}
	} else if err := r.execute(ctx); err != nil {
		return nil, err
	}
	r.sum.BytesRead = r.src.BytesRead.Load()

	if r.src2 != nil {
		r.sum.BytesRead += r.src2.BytesRead.Load()
	}
	if r.q != nil {
		r.sum.PagesSkipped = r.q.pagesSkipped.Load()
	}
	r.sum.Seconds = time.Since(start).Seconds()
	out := r.sum
	return &out, nil
}

func (r *runner) compile() error {
	j := &r.job
	if j.PartitionBy == "parts" {
		for _, src := range []*Source{r.src, r.src2} {
			if src != nil && (src == r.src || !j.Broadcast) {
				if err := checkParts(src, j.Partitions); err != nil {
					return err
				}
			}
		}
	}
	hash := j.keyColumns()
	var err error
	var keyOK func(arrow.Type) bool
	var keyWant string
	switch {
	case j.byValue():
		keyOK, keyWant = arrow.IsInteger, "an integer (the partition number)"
	case j.byRange():
		keyOK = func(t arrow.Type) bool {
			return t == arrow.STRING || t == arrow.BINARY || t == arrow.LARGE_STRING || t == arrow.LARGE_BINARY
		}
		keyWant = "a string or binary"
	}
	if keyOK != nil {
		for _, src := range []*Source{r.src, r.src2} {
			if src == nil {
				continue
			}
			sc, err := src.Schema([]string{resolveName(src.Files[0].Schema, hash[0])})
			if err != nil {
				return fmt.Errorf("--partition-by: %w", err)
			}
			if !keyOK(sc.Field(0).Type.ID()) {
				return fmt.Errorf("%w: --partition-by %s: the column is %s, want %s", ErrUsage, j.PartitionBy, sc.Field(0).Type, keyWant)
			}
		}
	}
	if len(j.SortBy) > 0 {
		if r.q, err = compileQuery(r.src, "", "", nil); err != nil {
			return err
		}
		for _, c := range j.SortBy {
			if _, err := r.src.Schema([]string{resolveName(r.src.Files[0].Schema, c)}); err != nil {
				return fmt.Errorf("sort_by: %w", err)
			}
		}
		// DuckDB sorts what the native sort does not (and partitions too
		// large for memory)
		r.sortKey = nativeSortKey(r.q, j.SortBy, r.src)
		r.sortSQL = sortSQL(j.SortBy)
		r.sql = &sqlRunner{memoryLimit: j.MemoryLimit}
		return nil
	}
	switch {
	case j.SQL != "":
		if hash != nil {
			if r.q, err = compileQuery(r.src, "", "", hash); err != nil {
				return err
			}
			for _, c := range hash {
				if _, err := r.src.Schema([]string{resolveName(r.src.Files[0].Schema, c)}); err != nil {
					return fmt.Errorf("--partition-by: %w", err)
				}
			}
		}
		r.sql = &sqlRunner{memoryLimit: j.MemoryLimit}
	case j.Aggs != "" || len(j.GroupBy) > 0:
		items, err := expr.ParseList(j.Aggs)
		if err != nil {
			return fmt.Errorf("--agg: %w", err)
		}
		var cols []string
		for _, k := range j.GroupBy {
			cols = append(cols, k)
		}
		for _, it := range items {
			cols = append(cols, expr.Columns(it.Expr)...)
		}
		var quoted []string
		seen := map[string]bool{}
		for _, c := range cols {
			c = resolveName(r.src.Files[0].Schema, c)
			if !seen[c] {
				seen[c] = true
				quoted = append(quoted, (&expr.Col{Name: c}).String())
			}
		}
		sel := strings.Join(quoted, ", ")
		if sel == "" {
			r.q, err = compileQueryCols(r.src, nil, j.Where)
		} else {
			r.q, err = compileQuery(r.src, sel, j.Where, nil)
		}
		if err != nil {
			return err
		}
		if r.agg, err = compileAgg(r.q.readSchema, j.GroupBy, items); err != nil {
			return err
		}
		// a single string key groups on the dictionary indices
		if len(r.agg.keyPos) == 1 && r.agg.keyKinds[0] == expr.TString {
			r.q.dict = make([]bool, len(r.q.readNames))
			r.q.dict[r.agg.keyPos[0]] = true
		}
	default:
		if r.q, err = compileQuery(r.src, j.Columns, j.Where, hash); err != nil {
			return err
		}
	}
	if j.Format == FormatFFRecord && r.q != nil && r.agg == nil && j.SQL == "" {
		if len(r.q.outSchema.FieldIndices(j.SampleColumn)) != 1 {
			return fmt.Errorf("%w: --sample-column %q is not an output column (have %s)", ErrUsage, j.SampleColumn, fieldNames(r.q.outSchema))
		}
	}
	return nil
}

// compileQueryCols compiles a query that reads only the filter's columns
// and outputs nothing (count(*)-only aggregates).
func compileQueryCols(src *Source, cols []string, where string) (*query, error) {
	q, err := compileQuery(src, "", where, nil)
	if err != nil {
		return nil, err
	}
	// drop the select-all list: keep the filter columns only
	var keep []string
	if q.whereNode != nil {
		for _, c := range expr.Columns(q.whereNode) {
			keep = append(keep, resolveName(src.Files[0].Schema, c))
		}
	}
	keep = append(keep, cols...)
	q2 := &query{whereNode: q.whereNode, pageCol: -1}
	for _, n := range keep {
		if !slices.Contains(q2.readNames, n) {
			q2.readNames = append(q2.readNames, n)
		}
	}
	if len(q2.readNames) == 0 {
		q2.readSchema = arrow.NewSchema(nil, nil) // Schema(nil) is every column
	} else if q2.readSchema, err = src.Schema(q2.readNames); err != nil {
		return nil, err
	}
	if q2.whereNode != nil {
		q2.filterPos = allPos(len(q2.readNames))
		if q2.where, err = expr.Compile(q2.whereNode, q2.readSchema); err != nil {
			return nil, err
		}
	}
	q2.outSchema = arrow.NewSchema(nil, nil)
	return q2, nil
}

func (r *runner) fingerprint(ctx context.Context) (string, error) {
	type in struct {
		Path string `json:"path"`
		Size int64  `json:"size"`
		Mod  int64  `json:"mod"`
	}
	list := func(src *Source) ([]in, error) {
		var out []in
		for _, f := range src.Files {
			st, err := f.fsys.Stat(ctx, mustInner(ctx, f.Path))
			if err != nil {
				return nil, fmt.Errorf("scan: stat %s: %w", f.Path, err)
			}
			out = append(out, in{f.Path, f.Size, st.ModTime.UnixNano()})
		}
		return out, nil
	}
	a, err := list(r.src)
	if err != nil {
		return "", err
	}
	var b []in
	if r.src2 != nil {
		if b, err = list(r.src2); err != nil {
			return "", err
		}
	}
	j := r.job
	doc := map[string]any{
		"v": "ffkit-scan-1", "inputs": a, "join": b, "columns": j.Columns, "where": j.Where,
		"group_by": j.GroupBy, "aggs": j.Aggs, "sql": j.SQL, "partition_by": j.PartitionBy,
		"partitions": j.Partitions, "bounds": j.Bounds, "format": j.Format, "sample_column": j.SampleColumn,
		"shard_size": j.ShardSize, "row_group_rows": j.RowGroupRows, "output": j.Output,
	}
	if j.Broadcast {
		doc["broadcast"] = true
	}
	if j.Compression != "" && j.Compression != "zstd" {
		doc["compression"] = j.Compression
	}
	if j.ZstdLevel != 0 {
		doc["zstd_level"] = j.ZstdLevel
	}
	if len(j.SortBy) > 0 {
		doc["sort_by"] = j.SortBy
	}
	if j.Salt != "" {
		doc["salt"] = j.Salt // absent otherwise: fingerprints of plain jobs stay as they were
	}
	enc, _ := json.Marshal(doc)
	sum := sha256.Sum256(enc)
	return hex.EncodeToString(sum[:16]), nil
}

func mustInner(ctx context.Context, p string) string {
	_, inner, err := fs.Resolve(ctx, p)
	if err != nil {
		return p
	}
	return inner
}

// prepareOutput decides where things go, and whether the output is
// already published by this very job. A work directory left by another
// job (another fingerprint) is removed with its part files, so a changed
// job never reuses stale partitions.
func (r *runner) prepareOutput(ctx context.Context) (bool, error) {
	j := &r.job
	fsys, inner, err := fs.Resolve(ctx, j.Output)
	if err != nil {
		return false, err
	}
	r.fsys = fsys
	ext := formatExt(j.Format)
	r.single = j.Format != FormatFFRecord && strings.HasSuffix(inner, ext)
	if r.single {
		dir, base := path.Split(inner)
		r.outDir = userPath(j.Output, path.Join(dir, "."+base+".ffkit"))
		r.work = r.outDir
		if st, err := fsys.Stat(ctx, inner); err == nil && !st.IsDir && j.Format == FormatParquet {
			if f, err := OpenFile(ctx, j.Output, nil); err == nil {
				fp, _ := f.KeyValue(KeyFingerprint)
				r.sum.RowsOut = f.Rows
				f.Close()
				if fp == r.fp {
					return true, nil
				}
			}
		}
		// a task run alone (RunTask) needs its marker: never direct
		r.direct = r.sel == nil && j.Format == FormatParquet && j.SQL == "" && len(j.SortBy) == 0 && (r.agg != nil || (r.partitions == 1 && j.keyColumns() == nil))
		if r.direct {
			return false, removeAll(ctx, r.work)
		}
	} else {
		r.outDir = j.Output
		r.work = fs.Join(j.Output, WorkDirName)
	}
	jobFile := fs.Join(r.work, "job.json")
	if b, err := readAll(ctx, jobFile); err == nil {
		var m marker
		if json.Unmarshal(b, &m) == nil && m.Fingerprint == r.fp {
			return false, nil // resume
		}
	}
	// another job's leftovers: clear them
	if err := removeAll(ctx, r.work); err != nil {
		return false, err
	}
	if !r.single {
		ents, err := fsys.List(ctx, inner)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("scan: list %s: %w", j.Output, err)
		}
		for _, e := range ents {
			if !e.IsDir && strings.HasPrefix(e.Name, "part-") {
				if err := fsys.Remove(ctx, path.Join(inner, e.Name)); err != nil {
					return false, fmt.Errorf("scan: remove stale %s: %w", e.Name, err)
				}
			}
		}
	}
	b, _ := json.Marshal(marker{Fingerprint: r.fp, Task: "job"})
	return false, writeFile(ctx, jobFile, b)
}

func readAll(ctx context.Context, p string) ([]byte, error) {
	fsys, inner, err := fs.Resolve(ctx, p)
	if err != nil {
		return nil, err
	}
	f, err := fsys.Open(ctx, inner, fs.OpenOptions{})
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.NewSectionReader(f, 0, f.Size()))
}

func writeFile(ctx context.Context, p string, b []byte) error {
	fsys, inner, err := fs.Resolve(ctx, p)
	if err != nil {
		return err
	}
	if err := fsys.MkdirAll(ctx, path.Dir(inner)); err != nil {
		return err
	}
	w, err := fsys.Create(ctx, inner)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		w.Close()
		return err
	}
	return w.Commit()
}

// removeAll removes a file or directory tree; a missing one is fine.
func removeAll(ctx context.Context, p string) error {
	fsys, inner, err := fs.Resolve(ctx, p)
	if err != nil {
		return err
	}
	var rm func(string) error
	rm = func(name string) error {
		st, err := fsys.Stat(ctx, name)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if st.IsDir {
			ents, err := fsys.List(ctx, name)
			if err != nil {
				return err
			}
			for _, e := range ents {
				if err := rm(path.Join(name, e.Name)); err != nil {
					return err
				}
			}
		}
		if err := fsys.Remove(ctx, name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("scan: remove %s: %w", name, err)
		}
		return nil
	}
	return rm(inner)
}

// fileRange is rows [lo, hi) of a file.
type fileRange struct {
	file   *File
	lo, hi int64
}

// partitionRanges splits the source into n partitions by files or rows
// ("" is one partition).
func partitionRanges(src *Source, by string, n int) [][]fileRange {
	parts := make([][]fileRange, n)
	switch by {
	case "rows":
		total := src.Rows()
		var off int64
		for _, f := range src.Files {
			lo := int64(0)
			for lo < f.Rows {
				g := off + lo // global row
				p := int(g * int64(n) / max(total, 1))
				// first global row of partition p+1
				end := (int64(p+1)*total + int64(n) - 1) / int64(n)
				hi := min(f.Rows, end-off)
				if hi <= lo {
					hi = lo + 1
				}
				parts[p] = append(parts[p], fileRange{f, lo, hi})
				lo = hi
			}
			off += f.Rows
		}
	case "parts":
		// the partition a part-PPPPP* file name says (checked by
		// checkParts); a stage's output keeps its partitions
		for _, f := range src.Files {
			if p, ok := partOfName(path.Base(f.Path)); ok && p < n {
				parts[p] = append(parts[p], fileRange{f, 0, f.Rows})
			}
		}
	case "files":
		nf := len(src.Files)
		for p := 0; p < n; p++ {
			for _, f := range src.Files[p*nf/n : (p+1)*nf/n] {
				parts[p] = append(parts[p], fileRange{f, 0, f.Rows})
			}
		}
	default:
		for _, f := range src.Files {
			parts[0] = append(parts[0], fileRange{f, 0, f.Rows})
		}
	}
	return parts
}

// units cuts file ranges into row-group units, dropping the row groups
// the filter rules out by their statistics.
func (r *runner) units(ranges []fileRange, count bool) []unit {
	var out []unit
	for _, fr := range ranges {
		var off int64
		for rg := 0; rg < fr.file.NumRowGroups(); rg++ {
			n := fr.file.RowGroupRows(rg)
			lo, hi := max(fr.lo, off), min(fr.hi, off+n)
			off += n
			if lo >= hi {
				continue
			}
			if count {
				r.sum.RowGroups++
			}
			if r.q != nil && !r.q.mayMatch(fr.file, rg) {
				if count {
					r.sum.RowGroupsSkipped++
				}
				continue
			}
			u := unit{file: fr.file, rg: rg, lo: lo - (off - n), hi: hi - (off - n)}
			if u.lo == 0 && u.hi == n {
				u.hi = -1
			}
			out = append(out, u)
		}
	}
	return out
}

func (r *runner) addPlanned(n int64) {
	r.mu.Lock()
	r.planned += n
	r.mu.Unlock()
}

func (r *runner) addDone(n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done += n
	if r.progress != nil {
		r.progress(r.done, r.planned)
	}
}

func partName(p int) string { return fmt.Sprintf("part-%05d", p) }

func (r *runner) kv(task string, p int) map[string]string {
	return map[string]string{
		KeyFingerprint: r.fp, KeyTask: task, KeyPartition: strconv.Itoa(p),
		KeyPartitions: strconv.Itoa(r.partitions), KeyPartitionBy: r.job.PartitionBy,
	}
}

func (r *runner) sinkOpts(stage, base string, sc *arrow.Schema, kv map[string]string) sinkOptions {
	format := r.job.Format
	if r.single {
		format = FormatParquet // parts of a single-file output; mergeInto converts
	}
	return sinkOptions{format: format, dir: stage, base: base, schema: sc, kv: kv,
		rowGroupRows: r.job.RowGroupRows, sampleColumn: r.job.SampleColumn, shardSize: r.job.ShardSize, zstdLevel: r.job.ZstdLevel,
		compression: r.job.Compression}
}

// execute plans the tasks and runs them.
func (r *runner) execute(ctx context.Context) error {
	j := &r.job
	n := r.partitions
	hash := j.keyColumns()
	par := func(tasks int) int { return max(1, j.Workers/max(1, min(tasks, j.Workers))) }
	var finals []marker

	switch {
	case r.agg != nil:
		m, err := r.runAgg(ctx)
		if err != nil {
			return err
		}
		if err := r.barrier(); err != nil {
			return err
		}
		finals = append(finals, m)

	case j.SQL != "" && hash != nil:
		// a rerun whose partitions are all published skips the shuffle
		// (its intermediate files are removed once the job is done)
		if !r.published(ctx, n) {
			if err := r.shuffle(ctx, r.src, "in", false); err != nil {
				return err
			}
			if r.src2 != nil {
				q1 := r.q
				var err error
				if r.q, err = compileQuery(r.src2, "", "", hash); err != nil {
					return err
				}
				err = r.shuffle(ctx, r.src2, "join", false)
				r.q = q1
				if err != nil {
					return err
				}
			}
			if err := r.barrier(); err != nil {
				return err
			}
		}
		ms, err := r.runTasks(ctx, n, func(p int) (string, taskFn) {
			return partName(p), r.sqlShuffledTask(p, par(n))
		})
		if err != nil {
			return err
		}
		finals = append(finals, ms...)

	case len(j.SortBy) > 0 && j.byRange():
		ms, err := r.rangeSort(ctx)
		if err != nil {
			return err
		}
		finals = append(finals, ms...)

	case len(j.SortBy) > 0:
		parts := partitionRanges(r.src, j.PartitionBy, n)
		for _, p := range parts {
			for _, fr := range p {
				r.addPlanned(fr.hi - fr.lo)
			}
		}
		ms, err := r.runTasks(ctx, n, func(p int) (string, taskFn) {
			if r.sortKey < 0 {
				return partName(p), r.sqlTask(p, parts[p], par(n))
			}
			return partName(p), r.sortTask(p, parts[p], par(n))
		})
		if err != nil {
			return err
		}
		finals = append(finals, ms...)

	case j.SQL != "":
		parts := partitionRanges(r.src, j.PartitionBy, n)
		for _, p := range parts {
			for _, fr := range p {
				r.addPlanned(fr.hi - fr.lo)
			}
		}
		ms, err := r.runTasks(ctx, n, func(p int) (string, taskFn) {
			return partName(p), r.sqlTask(p, parts[p], par(n))
		})
		if err != nil {
			return err
		}
		finals = append(finals, ms...)

	case hash != nil:
		if err := r.shuffle(ctx, r.src, "", true); err != nil {
			return err
		}
		if err := r.barrier(); err != nil {
			return err
		}
		ms, err := r.readMarkers(ctx, "shuffle-")
		if err != nil {
			return err
		}
		finals = append(finals, ms...)
		// empty partitions get a schema-only file
		have := map[int]bool{}
		for _, m := range ms {
			for _, f := range m.Files {
				if p, ok := partOfName(f); ok {
					have[p] = true
				}
			}
		}
		var empty []int
		for p := 0; p < n; p++ {
			if !have[p] {
				empty = append(empty, p)
			}
		}
		es, err := r.runTasks(ctx, len(empty), func(i int) (string, taskFn) {
			p := empty[i]
			return partName(p) + "-empty", r.emptyTask(p)
		})
		if err != nil {
			return err
		}
		finals = append(finals, es...)

	default:
		parts := partitionRanges(r.src, j.PartitionBy, n)
		units := make([][]unit, n)
		for p := range parts {
			units[p] = r.units(parts[p], true)
			for _, u := range units[p] {
				r.addPlanned(u.rows())
			}
		}
		ms, err := r.runTasks(ctx, n, func(p int) (string, taskFn) {
			return partName(p), r.nativeTask(p, units[p], par(n))
		})
		if err != nil {
			return err
		}
		finals = append(finals, ms...)
	}

	if err := r.barrier(); err != nil {
		return err
	}
	if r.sel != nil && r.sel.only != "" {
		// finishing (merge, cleanup) is the caller's, once every task is done
		return errTaskDone
	}
	var files []string
	for _, m := range finals {
		r.sum.RowsOut += m.Rows
		files = append(files, m.Files...)
	}
	sort.Strings(files)
	if r.single {
		if err := r.mergeInto(ctx, files); err != nil {
			return err
		}
		r.sum.OutputFiles = []string{j.Output}
		return removeAll(ctx, r.work)
	}
	for _, f := range files {
		r.sum.OutputFiles = append(r.sum.OutputFiles, fs.Join(r.outDir, f))
	}
	// the markers and job.json stay (they make a rerun a no-op); staging
	// and shuffle files go
	if err := removeAll(ctx, fs.Join(r.work, "staging")); err != nil {
		return err
	}
	return removeAll(ctx, fs.Join(r.work, "shuffle"))
}

// published reports whether the n partition tasks part-PPPPP of this job
// are all done and their files still in place.
func (r *runner) published(ctx context.Context, n int) bool {
	for p := 0; p < n; p++ {
		m, ok := r.readMarker(ctx, partName(p))
		if !ok || !r.filesExist(ctx, r.outDir, m.Files) {
			return false
		}
	}
	return true
}

// checkParts checks that every input file is named part-PPPPP* with
// PPPPP below n (--partition-by parts).
func checkParts(src *Source, n int) error {
	for _, f := range src.Files {
		p, ok := partOfName(path.Base(f.Path))
		if !ok {
			return fmt.Errorf("%w: --partition-by parts: %s is not named part-PPPPP* (a partitioned output's file)", ErrUsage, f.Path)
		}
		if p >= n {
			return fmt.Errorf("%w: --partition-by parts: %s is partition %d, outside [0, %d) (--partitions)", ErrUsage, f.Path, p, n)
		}
	}
	return nil
}

// partOfName parses the partition of "part-PPPPP..." file names.
func partOfName(name string) (int, bool) {
	if !strings.HasPrefix(name, "part-") || len(name) < 10 {
		return 0, false
	}
	p, err := strconv.Atoi(name[5:10])
	return p, err == nil
}

// taskFn runs a task, writing into the staging directory stage; it returns
// the files it wrote (relative to stage) and its output rows.
type taskFn func(ctx context.Context, stage string) ([]string, int64, error)

// runTasks runs n tasks, at most Workers at once.
func (r *runner) runTasks(ctx context.Context, n int, task func(i int) (string, taskFn)) ([]marker, error) {
	out := make([]marker, n)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.job.Workers)
	for i := 0; i < n; i++ {
		name, fn := task(i)
		g.Go(func() error {
			m, err := r.runTask(gctx, name, r.outDir, fn)
			out[i] = m
			return err
		})
	}
	return out, g.Wait()
}

func (r *runner) markerPath(name string) string { return fs.Join(r.work, "tasks", name+".json") }

func (r *runner) readMarker(ctx context.Context, name string) (marker, bool) {
	b, err := readAll(ctx, r.markerPath(name))
	if err != nil {
		return marker{}, false
	}
	var m marker
	if json.Unmarshal(b, &m) != nil || m.Fingerprint != r.fp {
		return marker{}, false
	}
	return m, true
}

func (r *runner) readMarkers(ctx context.Context, prefix string) ([]marker, error) {
	fsys, inner, err := fs.Resolve(ctx, fs.Join(r.work, "tasks"))
	if err != nil {
		return nil, err
	}
	ents, err := fsys.List(ctx, inner)
	if err != nil {
		return nil, fmt.Errorf("scan: list task markers: %w", err)
	}
	var out []marker
	for _, e := range ents {
		if strings.HasPrefix(e.Name, prefix) && strings.HasSuffix(e.Name, ".json") {
			if m, ok := r.readMarker(ctx, strings.TrimSuffix(e.Name, ".json")); ok {
				out = append(out, m)
			}
		}
	}
	return out, nil
}

func retryable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	switch errkind.Of(err) {
	case errkind.Data, errkind.Usage:
		return false
	}
	return true
}

// finalName maps a file a task wrote to its published name: FFRecord shards
// BASE/PART_nnnnn.ffr become BASE-nnnnn.ffr.
func finalName(rel string) string {
	if dir, file := path.Split(rel); dir != "" {
		return strings.TrimSuffix(dir, "/") + "-" + strings.TrimPrefix(file, "PART_")
	}
	return rel
}

// runTask runs one task unless its output is already published by this
// job: the task writes into a staging directory of its own, its files are
// renamed into dest, and a marker holding the job's fingerprint records it
// as done. A failed attempt is retried up to Retries times.
func (r *runner) runTask(ctx context.Context, name, dest string, fn taskFn) (marker, error) {
	r.mu.Lock()
	r.sum.Tasks++
	r.mu.Unlock()
	if r.direct {
		// nothing to resume
	} else if m, ok := r.readMarker(ctx, name); ok && r.filesExist(ctx, dest, m.Files) {
		r.mu.Lock()
		r.sum.TasksSkipped++
		r.mu.Unlock()
		if r.sel != nil {
			r.sel.published(name)
		}
		return m, nil
	}
	if r.sel != nil && !r.sel.take(name) {
		return marker{}, nil
	}
	var err error
	for attempt := 0; ; attempt++ {
		stage := fs.Join(r.work, "staging", fmt.Sprintf("%s.%s.%d", name, r.fp[:8], attempt))
		var m marker
		if m, err = r.attempt(ctx, name, stage, dest, fn); err == nil {
			return m, nil
		}
		removeAll(context.WithoutCancel(ctx), stage)
		if attempt >= r.job.Retries || !retryable(err) || ctx.Err() != nil {
			return marker{}, fmt.Errorf("task %s: %w", name, err)
		}
		r.mu.Lock()
		r.sum.Retries++
		r.mu.Unlock()
	}
}

// filesExist reports whether a marker's files are all still in dest (a
// task whose output was deleted by hand runs again).
func (r *runner) filesExist(ctx context.Context, dest string, files []string) bool {
	for _, f := range files {
		fsys, inner, err := fs.Resolve(ctx, fs.Join(dest, f))
		if err != nil {
			return false
		}
		if _, err := fsys.Stat(ctx, inner); err != nil {
			return false
		}
	}
	return true
}

// failTaskForTesting, when set, makes attempts of the named task fail.
var failTaskForTesting func(name string, attempt string) error

func (r *runner) attempt(ctx context.Context, name, stage, dest string, fn taskFn) (marker, error) {
	if err := removeAll(ctx, stage); err != nil {
		return marker{}, err
	}
	// the staging directory must exist before a sink creates files in it:
	// a local file system makes parents on create, a cluster does not
	stageFS, stageInner, err := fs.Resolve(ctx, stage)
	if err != nil {
		return marker{}, err
	}
	if err := stageFS.MkdirAll(ctx, stageInner); err != nil {
		return marker{}, fmt.Errorf("scan: make staging directory %s: %w", stage, err)
	}
	if failTaskForTesting != nil {
		if err := failTaskForTesting(name, stage); err != nil {
			return marker{}, err
		}
	}
	files, rows, err := fn(ctx, stage)
	if err != nil {
		return marker{}, err
	}
	fsys, destInner, err := fs.Resolve(ctx, dest)
	if err != nil {
		return marker{}, err
	}
	if err := fsys.MkdirAll(ctx, destInner); err != nil {
		return marker{}, err
	}
	m := marker{Fingerprint: r.fp, Task: name, Rows: rows}
	for _, f := range files {
		fn := finalName(f)
		if err := fsys.Rename(ctx, path.Join(stageInner, f), path.Join(destInner, fn)); err != nil {
			return marker{}, fmt.Errorf("scan: publish %s: %w", fn, err)
		}
		m.Files = append(m.Files, fn)
	}
	if !r.direct {
		b, _ := json.Marshal(m)
		if err := writeFile(ctx, r.markerPath(name), b); err != nil {
			return marker{}, err
		}
	}
	removeAll(ctx, stage)
	return m, nil
}

// nativeTask filters and projects partition p into one output file.
func (r *runner) nativeTask(p int, units []unit, par int) taskFn {
	return func(ctx context.Context, stage string) ([]string, int64, error) {
		name := partName(p)
		s, err := newSink(ctx, r.sinkOpts(stage, name, r.q.outSchema, r.kv(name, p)))
		if err != nil {
			return nil, 0, err
		}
		err = orderedMap(ctx, len(units), par,
			func(ctx context.Context, i int) (arrow.RecordBatch, error) {
				rec, err := r.q.read(ctx, units[i])
				if err != nil || rec == nil {
					return nil, err
				}
				defer rec.Release()
				return r.q.project(rec)
			},
			func(i int, rec arrow.RecordBatch) error {
				r.addDone(units[i].rows())
				if rec == nil {
					return nil
				}
				defer rec.Release()
				return s.Write(rec)
			}, releaseBatch)
		if err != nil {
			s.Abort()
			return nil, 0, err
		}
		return s.Close()
	}
}

// emptyTask writes a schema-only file for a partition that got no rows.
func (r *runner) emptyTask(p int) taskFn {
	return func(ctx context.Context, stage string) ([]string, int64, error) {
		name := partName(p) + "-empty"
		s, err := newSink(ctx, r.sinkOpts(stage, name, r.q.outSchema, r.kv(name, p)))
		if err != nil {
			return nil, 0, err
		}
		return s.Close()
	}
}

// shuffle hash-partitions a source: one producer task per group of row
// groups writes one file per partition that gets rows. With project (the
// native path) the producers also filter and project, and their files are
// the job's output; otherwise (SQL) the files are intermediate, under the
// work directory, named by side.
func (r *runner) shuffle(ctx context.Context, src *Source, side string, project bool) error {
	j := &r.job
	n := r.partitions
	var all []unit
	for _, pr := range partitionRanges(src, "", 1) {
		all = append(all, r.units(pr, true)...)
	}
	for _, u := range all {
		r.addPlanned(u.rows())
	}
	nprod := min(len(all), 2*j.Workers)
	keyPos := make([]int, 0)
	for _, c := range j.keyColumns() {
		keyPos = append(keyPos, slices.Index(r.q.readNames, resolveName(src.Files[0].Schema, c)))
	}
	dest := r.outDir
	if !project {
		dest = fs.Join(r.work, "shuffle")
	}
	prefix := "shuffle-"
	if side != "" {
		prefix += side + "-"
	}
	if PassDictionaries && (!project || j.Format == FormatParquet) && len(j.SortBy) == 0 {
		r.q.passDictionaries()
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(j.Workers)
	par := max(1, j.Workers/max(1, nprod))
	for k := 0; k < nprod; k++ {
		units := all[k*len(all)/nprod : (k+1)*len(all)/nprod]
		name := fmt.Sprintf("%s%05d", prefix, k)
		g.Go(func() error {
			_, err := r.runTask(gctx, name, dest, r.producerTask(units, keyPos, side, k, n, par, project))
			return err
		})
	}
	return g.Wait()
}

// PassDictionaries: shuffles into Parquet read string columns as
// dictionaries and write their indices (sinkdict.go). A switch for tests
// and benchmarks that compare with the decoded write.
var PassDictionaries = true

func (r *runner) producerTask(units []unit, keyPos []int, side string, k, n, par int, project bool) taskFn {
	q := r.q
	return func(ctx context.Context, stage string) ([]string, int64, error) {
		sinks := make([]sink, n)
		abort := func() {
			for _, s := range sinks {
				if s != nil {
					s.Abort()
				}
			}
		}
		var rows atomic.Int64
		err := orderedMap(ctx, len(units), par,
			func(ctx context.Context, i int) ([]arrow.RecordBatch, error) {
				rec, err := q.read(ctx, units[i])
				if err != nil || rec == nil {
					return nil, err
				}
				defer rec.Release()
				pieces, err := splitRows(ctx, rec, keyPos, n, r.job.byValue(), r.job.Bounds)
				if err != nil || !project {
					return pieces, err
				}
				for p, pc := range pieces {
					if pc == nil {
						continue
					}
					pieces[p], err = q.project(pc)
					pc.Release()
					if err != nil {
						releaseBatches(pieces[p+1:])
						releaseBatches(pieces[:p])
						return nil, err
					}
				}
				return pieces, nil
			},
			func(i int, pieces []arrow.RecordBatch) error {
				r.addDone(units[i].rows())
				defer releaseBatches(pieces)
				for p, pc := range pieces {
					if pc == nil {
						continue
					}
					if sinks[p] == nil {
						var base string
						var kv map[string]string
						if project {
							base = fmt.Sprintf("%s-%05d", partName(p), k)
							kv = r.kv(base, p)
						} else {
							base = fmt.Sprintf("p%05d-%s-%05d", p, side, k)
							kv = map[string]string{KeyFingerprint: r.fp, KeyPartition: strconv.Itoa(p)}
						}
						opts := r.sinkOpts(stage, base, arrow.NewSchema(pc.Schema().Fields(), nil), kv)
						opts.rowGroupBytes = max(4<<20, DefaultRowGroupBytes/int64(n))
						if !project {
							opts.format = FormatParquet
							// read once, removed once the job is done:
							// uncompressed (a quarter less CPU than zstd 1)
							opts.compression = "none"
						}
						s, err := newSink(ctx, opts)
						if err != nil {
							return err
						}
						sinks[p] = s
					}
					rows.Add(pc.NumRows())
					if err := sinks[p].Write(pc); err != nil {
						return err
					}
				}
				return nil
			}, releaseBatches)
		if err != nil {
			abort()
			return nil, 0, err
		}
		var files []string
		var out int64
		for p, s := range sinks {
			if s == nil {
				continue
			}
			sinks[p] = nil
			names, rowsOut, err := s.Close()
			if err != nil {
				abort()
				return nil, 0, err
			}
			files = append(files, names...)
			out += rowsOut
		}
		return files, out, nil
	}
}

func releaseBatches(bs []arrow.RecordBatch) {
	for _, b := range bs {
		if b != nil {
			b.Release()
		}
	}
}

// runAgg aggregates the whole input: per-worker partial tables are merged
// into one, written as a single file.
func (r *runner) runAgg(ctx context.Context) (marker, error) {
	name := "aggregate"
	if m, ok := r.readMarker(ctx, name); ok && !r.direct {
		r.sum.Tasks++
		r.sum.TasksSkipped++
		if r.sel != nil {
			r.sel.published(name)
		}
		return m, nil
	}
	if r.sel != nil && r.sel.only != name {
		r.sel.take(name) // listed, not run
		return marker{}, nil
	}
	j := &r.job
	var all []unit
	for _, pr := range partitionRanges(r.src, j.PartitionBy, r.partitions) {
		all = append(all, r.units(pr, true)...)
	}
	for _, u := range all {
		r.addPlanned(u.rows())
	}
	w := j.Workers
	pool := make(chan *groupTable, w)
	for i := 0; i < w; i++ {
		pool <- newGroupTable(r.agg)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(w)
	for _, u := range all {
		g.Go(func() error {
			rec, err := r.q.read(gctx, u)
			if err != nil {
				return err
			}
			if rec != nil {
				t := <-pool
				err = t.add(rec)
				pool <- t
				rec.Release()
			}
			r.addDone(u.rows())
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return marker{}, err
	}
	close(pool)
	var total *groupTable
	for t := range pool {
		if total == nil {
			total = t
		} else {
			total.merge(t)
		}
	}
	return r.runTask(ctx, name, r.outDir, func(ctx context.Context, stage string) ([]string, int64, error) {
		rec, err := total.result()
		if err != nil {
			return nil, 0, err
		}
		defer rec.Release()
		s, err := newSink(ctx, r.sinkOpts(stage, partName(0), rec.Schema(), r.kv(name, 0)))
		if err != nil {
			return nil, 0, err
		}
		if err := s.Write(rec); err != nil {
			s.Abort()
			return nil, 0, err
		}
		return s.Close()
	})
}

// mergeInto concatenates the part files (relative to outDir, in order)
// into the single output file.
func (r *runner) mergeInto(ctx context.Context, files []string) error {
	j := &r.job
	if len(files) == 1 && j.Format == FormatParquet {
		// one part: publish it under the output name
		_, from, _ := fs.Resolve(ctx, fs.Join(r.outDir, files[0]))
		_, to, _ := fs.Resolve(ctx, j.Output)
		if err := r.fsys.Rename(ctx, from, to); err != nil {
			return fmt.Errorf("scan: publish %s: %w", j.Output, err)
		}
		return nil
	}
	var sc *arrow.Schema
	var s sink
	dir, base := path.Split(mustInner(ctx, j.Output))
	stage := userPath(j.Output, path.Join(dir, "."+base+".ffkit", "merge"))
	for _, f := range files {
		pf, err := OpenFile(ctx, fs.Join(r.outDir, f), r.src.BytesRead)
		if err != nil {
			return err
		}
		if s == nil {
			sc = pf.Schema
			kv := r.kv("merge", -1)
			delete(kv, KeyPartition)
			opts := r.sinkOpts(stage, strings.TrimSuffix(base, formatExt(j.Format)), sc, kv)
			opts.format = j.Format
			if s, err = newSink(ctx, opts); err != nil {
				pf.Close()
				return err
			}
		}
		cols := allPos(pf.Schema.NumFields())
		for rg := 0; rg < pf.NumRowGroups(); rg++ {
			rec, err := pf.ReadRowGroup(ctx, rg, cols)
			if err == nil {
				err = s.Write(rec)
				rec.Release()
			}
			if err != nil {
				pf.Close()
				s.Abort()
				return err
			}
		}
		pf.Close()
	}
	names, _, err := s.Close()
	if err != nil {
		return err
	}
	_, from, _ := fs.Resolve(ctx, fs.Join(stage, names[0]))
	_, to, _ := fs.Resolve(ctx, j.Output)
	if err := r.fsys.Rename(ctx, from, to); err != nil {
		return fmt.Errorf("scan: publish %s: %w", j.Output, err)
	}
	return nil
}
