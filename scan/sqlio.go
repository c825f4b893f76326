package scan

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
)

// DuckDB reads the Parquet files of a SQL task itself, so ffkit's own
// counters never see those bytes. Its FileSystem log does: every READ with
// the file, the offset and the length. sqlReads turns that log into the
// figures a scan summary reports for native jobs: bytes read, and which
// row groups were touched (a row group counts as read when any read
// overlaps one of its column chunks).

// enableReadLog turns on DuckDB's FileSystem log for the connection.
func enableReadLog(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, "CALL enable_logging('FileSystem')"); err != nil {
		return fmt.Errorf("scan: DuckDB: enable the file system log: %w", err)
	}
	return nil
}

// sqlReadStats is what one SQL task read of its inputs.
type sqlReadStats struct {
	Bytes      int64
	Groups     int // row groups of the inputs that DuckDB read from
	GroupsSeen int // row groups of the inputs
}

// sqlReads reads DuckDB's FileSystem log and attributes the READs on the
// task's input files (local paths DuckDB opened, mapped to the Parquet
// files they hold) to bytes and row groups.
func sqlReads(ctx context.Context, conn *sql.Conn, inputs map[string]*File) (sqlReadStats, error) {
	var st sqlReadStats
	rows, err := conn.QueryContext(ctx, "SELECT message FROM duckdb_logs WHERE type = 'FileSystem'")
	if err != nil {
		return st, fmt.Errorf("scan: DuckDB: read the file system log: %w", err)
	}
	defer rows.Close()
	read := map[*File]map[int]bool{}
	for rows.Next() {
		var msg string
		if err := rows.Scan(&msg); err != nil {
			return st, fmt.Errorf("scan: DuckDB file system log: %w", err)
		}
		var e struct {
			Path  string `json:"path"`
			Op    string `json:"op"`
			Bytes string `json:"bytes"`
			Pos   string `json:"pos"`
		}
		if err := json.Unmarshal([]byte(msg), &e); err != nil || e.Op != "READ" {
			continue
		}
		f := inputs[e.Path]
		if f == nil {
			continue // the output, spill files
		}
		n, err1 := strconv.ParseInt(e.Bytes, 10, 64)
		pos, err2 := strconv.ParseInt(e.Pos, 10, 64)
		if err1 != nil || err2 != nil {
			return st, fmt.Errorf("scan: DuckDB file system log: bad READ entry %q", msg)
		}
		st.Bytes += n
		if read[f] == nil {
			read[f] = map[int]bool{}
		}
		for rg := 0; rg < f.NumRowGroups(); rg++ {
			if !read[f][rg] && f.rowGroupOverlaps(rg, pos, pos+n) {
				read[f][rg] = true
			}
		}
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("scan: DuckDB file system log: %w", err)
	}
	seen := map[*File]bool{}
	for _, f := range inputs {
		if !seen[f] {
			seen[f] = true
			st.GroupsSeen += f.NumRowGroups()
			st.Groups += len(read[f])
		}
	}
	return st, nil
}

// rowGroupOverlaps reports whether bytes [lo, hi) of the file overlap a
// column chunk of row group rg.
func (pf *File) rowGroupOverlaps(rg int, lo, hi int64) bool {
	rgm := pf.meta.RowGroup(rg)
	for c := 0; c < rgm.NumColumns(); c++ {
		cc, err := rgm.ColumnChunk(c)
		if err != nil {
			continue
		}
		s, e := chunkRange(cc)
		if lo < e && s < hi {
			return true
		}
	}
	return false
}
