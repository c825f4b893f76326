package scan

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/duckdb/duckdb-go/v2"

	"github.com/ffkit/ffkit/fs"
	"github.com/ffkit/ffkit/internal/errkind"
)

// sqlRunner holds the settings of per-partition DuckDB tasks.
type sqlRunner struct {
	memoryLimit string
}

func sqlString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// localize returns a local path DuckDB can open for a user path: the path
// itself on the local file system, else a copy under tmp.
func localize(ctx context.Context, p, tmp string) (string, error) {
	fsys, inner, err := fs.Resolve(ctx, p)
	if err != nil {
		return "", err
	}
	if fsys.String() == "local" {
		return filepath.Abs(inner)
	}
	f, err := fsys.Open(ctx, inner, fs.OpenOptions{})
	if err != nil {
		return "", err
	}
	defer f.Close()
	out, err := os.CreateTemp(tmp, "in-*.parquet")
	if err != nil {
		return "", err
	}
	defer out.Close()
	if _, err := io.Copy(out, io.NewSectionReader(f, 0, f.Size())); err != nil {
		return "", fmt.Errorf("scan: copy %s for DuckDB: %w", p, err)
	}
	return out.Name(), nil
}

// rangesView is the SQL text of a partition made of file row ranges. It
// records in inputs the local path DuckDB reads for each file.
func rangesView(ctx context.Context, ranges []fileRange, tmp string, empty *File, inputs map[string]*File) (string, error) {
	var whole, parts []string
	for _, fr := range ranges {
		lp, err := localize(ctx, fr.file.Path, tmp)
		if err != nil {
			return "", err
		}
		inputs[lp] = fr.file
		if fr.lo == 0 && fr.hi == fr.file.Rows {
			whole = append(whole, sqlString(lp))
			continue
		}
		parts = append(parts, fmt.Sprintf("SELECT * EXCLUDE (file_row_number) FROM read_parquet(%s, file_row_number=true) WHERE file_row_number >= %d AND file_row_number < %d",
			sqlString(lp), fr.lo, fr.hi))
	}
	if len(whole) > 0 {
		parts = append([]string{fmt.Sprintf("SELECT * FROM read_parquet([%s], union_by_name=true)", strings.Join(whole, ", "))}, parts...)
	}
	if len(parts) == 0 {
		// an empty partition still has the input's columns
		lp, err := localize(ctx, empty.Path, tmp)
		if err != nil {
			return "", err
		}
		inputs[lp] = empty
		return fmt.Sprintf("SELECT * FROM read_parquet(%s) LIMIT 0", sqlString(lp)), nil
	}
	return strings.Join(parts, " UNION ALL BY NAME "), nil
}

// sqlTask runs the query over partition p given as file row ranges.
func (r *runner) sqlTask(p int, ranges []fileRange, par int) taskFn {
	return func(ctx context.Context, stage string) ([]string, int64, error) {
		tmp, err := os.MkdirTemp("", "ffkit-sql-")
		if err != nil {
			return nil, 0, err
		}
		defer os.RemoveAll(tmp)
		inputs := map[string]*File{}
		view, err := rangesView(ctx, ranges, tmp, r.src.Files[0], inputs)
		if err != nil {
			return nil, 0, err
		}
		views := map[string]string{"input": view}
		if r.src2 != nil {
			// input2: partition p of a co-partitioned second input
			// (--partition-by parts), else all of it (a broadcast join)
			by := ""
			if r.job.PartitionBy == "parts" && !r.job.Broadcast {
				by = "parts"
			}
			ranges2 := partitionRanges(r.src2, by, r.partitions)[0]
			if by != "" {
				ranges2 = partitionRanges(r.src2, by, r.partitions)[p]
			}
			if views["input2"], err = rangesView(ctx, ranges2, tmp, r.src2.Files[0], inputs); err != nil {
				return nil, 0, err
			}
		}
		files, rows, err := r.runSQL(ctx, stage, tmp, p, views, par, inputs)
		var in int64
		for _, fr := range ranges {
			in += fr.hi - fr.lo
		}
		r.addDone(in)
		return files, rows, err
	}
}

// sqlShuffledTask runs the query over partition p of hash-partitioned
// (shuffled) inputs: input, and input2 for a join.
func (r *runner) sqlShuffledTask(p, par int) taskFn {
	return func(ctx context.Context, stage string) ([]string, int64, error) {
		tmp, err := os.MkdirTemp("", "ffkit-sql-")
		if err != nil {
			return nil, 0, err
		}
		defer os.RemoveAll(tmp)
		shuffle := fs.Join(r.work, "shuffle")
		fsys, inner, err := fs.Resolve(ctx, shuffle)
		if err != nil {
			return nil, 0, err
		}
		ents, err := fsys.List(ctx, inner)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, 0, fmt.Errorf("scan: list %s: %w", shuffle, err)
		}
		views := map[string]string{}
		for _, side := range []struct {
			name, table string
			src         *Source
		}{{"in", "input", r.src}, {"join", "input2", r.src2}} {
			if side.src == nil {
				continue
			}
			prefix := fmt.Sprintf("p%05d-%s-", p, side.name)
			var ranges []fileRange
			for _, e := range ents {
				if strings.HasPrefix(e.Name, prefix) {
					f, err := OpenFile(ctx, fs.Join(shuffle, e.Name), nil)
					if err != nil {
						return nil, 0, err
					}
					ranges = append(ranges, fileRange{f, 0, f.Rows})
					defer f.Close()
				}
			}
			// The shuffle stage counted the reads of the job's inputs.
			v, err := rangesView(ctx, ranges, tmp, side.src.Files[0], map[string]*File{})
			if err != nil {
				return nil, 0, err
			}
			views[side.table] = v
		}
		return r.runSQL(ctx, stage, tmp, p, views, par, nil)
	}
}

// runSQL runs the job's query in a fresh in-memory DuckDB with the given
// views, limited to the task's memory and threads, and writes the result
// through the job's sink. What DuckDB read of inputs (local path -> file)
// is added to the job's summary.
func (r *runner) runSQL(ctx context.Context, stage, tmp string, p int, views map[string]string, par int, inputs map[string]*File) ([]string, int64, error) {
	db, err := sql.Open("duckdb", "")
	if err != nil {
		return nil, 0, fmt.Errorf("scan: start DuckDB: %w", err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("scan: start DuckDB: %w", err)
	}
	defer conn.Close()
	out := filepath.Join(tmp, "result.parquet")
	stmts := []string{
		"SET memory_limit=" + sqlString(r.sql.memoryLimit),
		fmt.Sprintf("SET threads=%d", par),
		"SET temp_directory=" + sqlString(filepath.Join(tmp, "spill")),
	}
	for name, v := range views {
		stmts = append(stmts, fmt.Sprintf("CREATE VIEW %s AS %s", name, v))
	}
	for _, s := range stmts {
		if _, err := conn.ExecContext(ctx, s); err != nil {
			return nil, 0, fmt.Errorf("scan: DuckDB setup (%s): %w", s, err)
		}
	}
	if inputs != nil {
		if err := enableReadLog(ctx, conn); err != nil {
			return nil, 0, err
		}
	}
	q := strings.TrimRight(strings.TrimSpace(cmp.Or(r.job.SQL, r.sortSQL)), ";")
	// Parse and bind the user's query alone first: DuckDB's message then
	// quotes the query as written, with the position of the mistake,
	// instead of ffkit's COPY around it.
	stmt, err := conn.PrepareContext(ctx, q)
	if err != nil {
		return nil, 0, sqlError(p, err)
	}
	stmt.Close()
	copyStmt := fmt.Sprintf("COPY (%s) TO %s (FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE %d)", q, sqlString(out), r.job.RowGroupRows)
	if _, err := conn.ExecContext(ctx, copyStmt); err != nil {
		return nil, 0, sqlError(p, err)
	}
	if inputs != nil {
		st, err := sqlReads(ctx, conn, inputs)
		if err != nil {
			return nil, 0, err
		}
		r.src.BytesRead.Add(st.Bytes)
		r.mu.Lock()
		r.sum.RowGroups += st.GroupsSeen
		r.sum.RowGroupsSkipped += st.GroupsSeen - st.Groups
		r.mu.Unlock()
	}
	res, err := OpenFile(ctx, out, nil)
	if err != nil {
		return nil, 0, err
	}
	defer res.Close()
	name := partName(p)
	s, err := newSink(ctx, r.sinkOpts(stage, name, res.Schema, r.kv(name, p)))
	if err != nil {
		return nil, 0, err
	}
	cols := allPos(res.Schema.NumFields())
	for rg := 0; rg < res.NumRowGroups(); rg++ {
		rec, err := res.ReadRowGroup(ctx, rg, cols)
		if err == nil {
			err = s.Write(rec)
			rec.Release()
		}
		if err != nil {
			s.Abort()
			return nil, 0, err
		}
	}
	return s.Close()
}

// sqlError wraps a DuckDB error of the --sql query; a query DuckDB cannot
// parse or bind is a usage error.
func sqlError(p int, err error) error {
	var de *duckdb.Error
	if errors.As(err, &de) {
		switch de.Type {
		case duckdb.ErrorTypeParser, duckdb.ErrorTypeBinder, duckdb.ErrorTypeCatalog:
			return errkind.Wrap(errkind.Usage, fmt.Errorf("scan: --sql on partition %d: %w", p, err))
		}
	}
	return fmt.Errorf("scan: --sql on partition %d: %w", p, err)
}
