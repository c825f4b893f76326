// Package expr parses and evaluates the SQL expressions of ffkit scan jobs:
// the boolean --where filter, computed columns in --columns, and the
// arguments of --agg aggregates.
//
// The grammar is a subset of SQL: column names (bare or "double quoted"),
// integer, float, 'string' (a quote inside doubled), TRUE, FALSE, NULL,
// DATE 'yyyy-mm-dd' and TIMESTAMP 'yyyy-mm-dd hh:mm:ss[.ffffff]' literals;
// arithmetic + - * / % and string concatenation ||; comparisons
// = == != <> < <= > >=; AND, OR, NOT; x [NOT] IN (list); x [NOT] BETWEEN a
// AND b; x IS [NOT] NULL; x [NOT] LIKE / ILIKE 'pattern' (% and _); and the
// functions lower, upper, length, abs, coalesce. Keywords are
// case-insensitive.
//
// Semantics follow SQL (and DuckDB where SQL leaves a choice): any NULL
// operand makes arithmetic and comparisons NULL; AND/OR use three-valued
// logic (FALSE AND NULL is FALSE, TRUE OR NULL is TRUE); a filter keeps a
// row only where the predicate is TRUE; x IN (...) is NULL when x is NULL,
// or when no element matches and the list holds a NULL; '/' always divides
// as floating point and division or modulo by zero yields NULL; integer
// arithmetic wraps on overflow.
//
// Values are evaluated column-at-a-time over Arrow record batches in a
// small set of kinds: integers (all Arrow integer types), floats (float32,
// float64 and decimals, which are compared as float64), strings (string and
// binary), booleans, dates (days) and timestamps (microseconds; a
// nanosecond column is truncated to microseconds for comparisons).
//
// A compiled Program is immutable and safe for concurrent use; the Vec
// values it returns may alias the batch's buffers and are valid while the
// batch is.
package expr
