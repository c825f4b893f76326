"""``ffkit.scan``: SmallPond-style columnar scans into a pyarrow Table.

The engine runs the scan (Parquet in; projection, filter, group-by
aggregates or SQL through DuckDB) and writes the result as one uncompressed
Arrow IPC file in shared memory (tmpfs); this process maps it, and pyarrow
reads the Table straight from the mapping: no copy, no decoding. Needs
pyarrow (not a dependency of ffkit: install it to use this function).
"""
import mmap
import os

from . import _engine


def scan(inputs, columns=None, where=None, sql=None, group_by=None, aggs=None, workers=None, with_summary=False):
    """Scans Parquet ``inputs`` (files, globs, directories; local paths or
    ffkit:// URLs) and returns a ``pyarrow.Table``.

    Args:
        columns: select list, e.g. ``"id, score * 2 AS s2"`` (default: all).
        where: SQL boolean filter, e.g. ``"lang = 'en' AND score > 0.9"``.
        sql: a DuckDB query over the table ``input`` (excludes the others).
        group_by, aggs: ``group_by=["lang"], aggs="count(*), mean(score)"``.
        workers: parallel row-group decoders (default: CPUs).
        with_summary: also return the engine's summary dict (rows, bytes
            read, row groups skipped...).
    """
    try:
        import pyarrow as pa
        import pyarrow.ipc
    except ImportError as e:
        raise ImportError("ffkit.scan needs pyarrow (pip install pyarrow)") from e
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    header = {
        "op": "scan", "inputs": [os.fspath(p) for p in inputs], "columns": columns or "", "where": where or "",
        "sql": sql or "", "group_by": list(group_by or []), "aggs": aggs or "", "workers": int(workers or 0),
    }
    rep = _engine.get().call(header)
    fd = rep.fds[0]
    rep.fds = []
    try:
        mm = mmap.mmap(fd, rep.header["size"], flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    table = pa.ipc.open_file(pa.py_buffer(mm)).read_all()
    if with_summary:
        return table, rep.header.get("summary")
    return table
