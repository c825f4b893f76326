"""``ffkit.scan``: SmallPond-style columnar scans into a pyarrow Table.

The engine runs the scan (Parquet in; projection, filter, group-by
aggregates or SQL through DuckDB) and writes the result as one uncompressed
Arrow IPC file in shared memory (tmpfs); this process maps it, and pyarrow
reads the Table straight from the mapping: no copy, no decoding. Needs
pyarrow (not a dependency of ffkit: install it to use this function).
"""
import mmap
import os


def _names(value, what):
    """A list of names from a str ("a, b" or "a") or an iterable of str."""
    if value is None:
        return []
    if isinstance(value, str):
        return [p.strip() for p in value.split(",") if p.strip()]
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"ffkit.scan: {what} must be a str or a list of str, not {type(value).__name__}") from None
    for v in items:
        if not isinstance(v, str):
            raise TypeError(f"ffkit.scan: {what} must be a str or a list of str; found {type(v).__name__} {v!r}")
    return [v.strip() for v in items if v.strip()]


def _exprs(value, what):
    """One comma-separated expression list from a str or a list of str."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return ", ".join(_names(value, what))


def scan(inputs, columns=None, where=None, sql=None, group_by=None, aggs=None, workers=None, with_summary=False):
    """Scans Parquet ``inputs`` and returns a ``pyarrow.Table``.

    Args:
        inputs: a path, glob, directory or ``ffkit://HOST:PORT/...`` URL, or a
            list of them.
        columns: the select list, a str (``"id, score * 2 AS s2"``) or a list
            of expressions (``["id", "score * 2 AS s2"]``); default: all.
        where: an SQL boolean filter, e.g. ``"lang = 'en' AND score > 0.9"``.
        sql: a DuckDB query over the table ``input`` (instead of columns,
            where, group_by and aggs).
        group_by: the grouping columns, a str (``"lang"`` or
            ``"lang, country"``) or a list (``["lang", "country"]``).
        aggs: the aggregates, a str (``"count(*), mean(score)"``) or a list
            (``["count(*)", "mean(score)"]``).
        workers: parallel row-group decoders (default: one per CPU).
        with_summary: also return the engine's summary dict (rows, bytes
            read, row groups skipped...), as ``(table, summary)``.

    Returns:
        A ``pyarrow.Table`` mapped from shared memory (no copy), or
        ``(table, summary)`` when ``with_summary``.

    Raises:
        ffkit.errors.UsageError: a bad query or argument (the message names it).
        ffkit.errors.NotFoundError: an input does not exist.

    Example:
        ``ffkit.scan("data/*.parquet", group_by="lang", aggs="count(*)")``
    """
    try:
        import pyarrow as pa
        import pyarrow.ipc
    except ImportError as e:
        raise ImportError("ffkit.scan needs pyarrow (pip install pyarrow)") from e
    from . import _engine, _protocol

    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    req = _protocol.ScanRequest(
        inputs=[os.fspath(p) for p in inputs], columns=_exprs(columns, "columns"), where=where or "",
        sql=sql or "", group_by=_names(group_by, "group_by"), aggs=_exprs(aggs, "aggs"), workers=int(workers or 0),
    )
    rep = _engine.get().call(req)
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
