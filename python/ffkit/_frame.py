"""SmallPond's DataFrame over ffkit's scan engine: lazy multi-stage jobs.

A pipeline ports from SmallPond by changing the import::

    sp = ffkit.session()                       # smallpond.init()
    df = sp.read_parquet("logs/*.parquet")
    df = df.repartition(8, hash_by="user")
    df = sp.partial_sql("SELECT user, count(*) AS n FROM {0} GROUP BY user", df)
    df.write_parquet("out/")                   # runs the plan
    df.to_pandas()

Each DataFrame is a node of a plan; nothing runs until an action
(``write_parquet``, ``to_arrow``, ``count``, ``take`` ...). Every stage is a
scan job (Go engine) or a Python-function stage (``map``/``filter``/
``flat_map`` with a callable, ``map_batches``) writing its partitions as
``part-PPPPP*.parquet`` into its own directory under the session's
``data_root``. A stage's directory is named by a hash of its definition and
of its inputs' definitions, and every task publishes by staging and atomic
rename with a marker, so a rerun of a pipeline recomputes exactly the
stages that changed and the stages downstream of them; the others are
reused.

Executors: ``"local"`` runs the scan jobs in the Go engine (tasks in
parallel, bounded by ``workers``) and the Python stages in a thread pool;
``"ray"`` runs every task as a Ray task (``ffkit scan --job J --task T``
on that node's engine, or the Python function), retried when its worker
dies. Ray tasks need the stage directories on a file system every node
sees: a shared directory, or an ``ffkit://`` cluster for scan stages.
Python-function stages read and write local (or mounted) paths.

Needs pyarrow; the Ray executor needs ray (``pip install ffkit[ray]``).
"""
import base64
import concurrent.futures
import glob as _glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

__all__ = ["session", "Session", "DataFrame"]

_PART = re.compile(r"^part-(\d{5})")
_REMOTE = "ffkit://"


def _pa():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("ffkit's DataFrame needs pyarrow (pip install pyarrow)") from e
    return pa, pq


def _join(root, name):
    return root.rstrip("/") + "/" + name


def _names(value, what):
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",")]
    out = [v for v in (value or []) if v]
    for v in out:
        if not isinstance(v, str):
            raise TypeError(f"ffkit: {what} must be a str or a list of str; found {type(v).__name__} {v!r}")
    if not out:
        raise ValueError(f"ffkit: {what} names no column")
    return out


def _fn_fingerprint(fn):
    """What identifies a Python function across runs: its name, code,
    constants and closure values (a changed function reruns its stage)."""
    parts = [getattr(fn, "__module__", ""), getattr(fn, "__qualname__", repr(fn))]
    code = getattr(fn, "__code__", None)
    if code is not None:
        parts += [code.co_code.hex(), repr(code.co_consts), repr(code.co_names)]
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                parts.append(repr(cell.cell_contents))
            except ValueError:
                parts.append("<empty>")
    return "|".join(parts)


class _Node:
    """One stage of a plan (or a source: the user's input paths)."""

    def __init__(self, kind, inputs=(), spec=None, fn=None, nparts=1, paths=None):
        self.kind = kind  # "source", "go" (a scan job) or "py" (a Python function)
        self.inputs = list(inputs)
        self.spec = dict(spec or {})
        self.fn = fn
        self.nparts = nparts
        self.paths = paths
        h = hashlib.sha256()
        h.update(json.dumps([kind, self.spec, paths, nparts, [i.key for i in self.inputs]], sort_keys=True).encode())
        if fn is not None:
            h.update(_fn_fingerprint(fn).encode())
        self.key = h.hexdigest()[:16]

    @property
    def name(self):
        op = self.spec.get("op") or ("sql" if self.spec.get("sql") else "scan")
        return f"{self.kind}-{op}-{self.key}"

    def parted(self):
        """Whether the output files are part-PPPPP* of nparts partitions."""
        return self.kind != "source"


class DataFrame:
    """A lazy, partitioned table: a node of a plan in a Session."""

    def __init__(self, session, node):
        self._session = session
        self._node = node

    def __repr__(self):
        return f"DataFrame({self._node.name}, {self._node.nparts} partitions)"

    @property
    def num_partitions(self):
        return self._node.nparts

    # --- transformations (lazy) ---

    def _go(self, spec, inputs=None, nparts=None, per_partition=True):
        node = self._node
        inputs = inputs or [node]
        spec = dict(spec)
        if per_partition and node.parted():
            spec.setdefault("partition_by", "parts")
            spec.setdefault("partitions", node.nparts)
        return DataFrame(self._session, _Node("go", inputs, spec, nparts=nparts or node.nparts))

    def _py(self, op, fn):
        if not callable(fn):
            raise TypeError(f"ffkit: {op} takes a SQL string or a callable, not {type(fn).__name__}")
        return DataFrame(self._session, _Node("py", [self._node], {"op": op}, fn=fn, nparts=self._node.nparts))

    def repartition(self, npartitions, hash_by=None, by=None, by_rows=False, range_by=None, bounds=None):
        """Partitions into ``npartitions``: by the hash of ``hash_by``
        columns (equal keys in one partition), by the integer column ``by``
        (its value is the partition), by rows (``by_rows=True``: equal row
        counts), by ranges of the string or binary column ``range_by``
        split at ``bounds`` (``npartitions - 1`` ascending str or bytes:
        partition p holds the keys in [bounds[p-1], bounds[p]), compared
        bytewise, NULL in partition 0), or by files (the default)."""
        n = int(npartitions)
        if n < 1:
            raise ValueError(f"ffkit: repartition({npartitions}): want at least 1 partition")
        if sum(bool(x) for x in (hash_by, by, by_rows, range_by)) > 1:
            raise ValueError("ffkit: repartition takes one of hash_by, by, by_rows, range_by")
        spec = {"op": "repartition", "partitions": n}
        if (bounds is not None) != bool(range_by):
            raise ValueError("ffkit: repartition: range_by and bounds go together")
        if hash_by:
            how = "hash:" + ",".join(_names(hash_by, "hash_by"))
        elif by:
            how = "column:" + _names(by, "by")[0]
        elif by_rows:
            how = "rows"
        elif range_by:
            how = "range:" + _names(range_by, "range_by")[0]
            bs = [b.encode() if isinstance(b, str) else bytes(b) for b in bounds]
            if len(bs) != n - 1:
                raise ValueError(f"ffkit: repartition({n}, range_by=...): want {n - 1} bounds, got {len(bs)}")
            if bs != sorted(bs):
                raise ValueError("ffkit: repartition: bounds must be ascending")
            spec["bounds"] = [base64.b64encode(b).decode() for b in bs]
        else:
            how = "files"
        spec["partition_by"] = how
        return self._go(spec, nparts=n, per_partition=False)

    def filter(self, predicate):
        """Keeps the rows where ``predicate`` holds: a SQL boolean
        expression, or a function of a row (a dict) returning a bool."""
        if isinstance(predicate, str):
            return self._go({"op": "filter", "where": predicate})
        return self._py("filter", predicate)

    def map(self, fn):
        """A SQL select list (``"a, b * 2 AS c"``), or a function from a row
        (a dict) to a row."""
        if isinstance(fn, str):
            return self._go({"op": "map", "columns": fn})
        return self._py("map", fn)

    def flat_map(self, fn):
        """A SQL select list that may produce several rows per row
        (``"unnest(tags) AS tag"``), or a function from a row to a list of
        rows."""
        if isinstance(fn, str):
            return self._go({"op": "flat_map", "sql": f"SELECT {fn} FROM input"})
        return self._py("flat_map", fn)

    def map_batches(self, fn):
        """A function from a ``pyarrow.Table`` (a batch of a partition) to a
        ``pyarrow.Table``."""
        return self._py("map_batches", fn)

    def partial_sort(self, by):
        """Sorts each partition by the columns ``by``."""
        keys = _names(by, "by")
        if all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k in keys):
            # ascending columns: the engine sorts one string, binary or
            # integer key natively and hands other keys to DuckDB
            return self._go({"op": "sort", "sort_by": list(keys)})
        keys = ", ".join(keys)  # ORDER BY terms (DESC, NULLS FIRST, ...)
        return self._go({"op": "sort", "sql": f"SELECT * FROM input ORDER BY {keys}"})

    def limit(self, n):
        """At most ``n`` rows (one partition)."""
        n = int(n)
        part = self._go({"op": "limit", "sql": f"SELECT * FROM input LIMIT {n}"})
        return part._go({"op": "limit", "sql": f"SELECT * FROM input LIMIT {n}"}, nparts=1, per_partition=False)

    # --- actions ---

    def compute(self):
        """Runs the plan up to this DataFrame (stages already published are
        reused) and returns its directory."""
        if self._node.kind == "source":
            return self._session._run(self._go({"op": "read"})._node)  # a copy, in one partition
        return self._session._run(self._node)

    def write_parquet(self, path):
        """Runs the plan and writes the result to ``path``: a directory of
        part files, one or more per partition, or one file when the path
        ends in .parquet. Local or ``ffkit://``."""
        return self._write(path, {"format": "parquet"})

    def write_ffrecord(self, path, sample_column, shard_size=None):
        """Runs the plan and packs the bytes of ``sample_column`` (one
        sample per row) into FFRecord shards under the directory ``path``."""
        spec = {"format": "ffrecord", "sample_column": sample_column}
        if shard_size:
            spec["shard_size"] = int(shard_size)
        return self._write(path, spec)

    def _write(self, path, spec):
        path = os.fspath(path)
        out = self._go(dict(spec, op="write", output=path))
        self._session._run(out._node)
        return path

    def _files(self):
        d = self.compute()
        return d, self._session._part_files(d)

    def to_arrow(self):
        """Runs the plan and returns the result as one ``pyarrow.Table``
        (partitions in order)."""
        pa, pq = _pa()
        d, files = self._files()
        if d.startswith(_REMOTE):
            from ._scan import scan

            return scan(d)
        tables = [pq.read_table(f) for f in files]
        if not tables:
            return pa.table({})
        return pa.concat_tables(tables, promote_options="default")

    def to_pandas(self):
        """Runs the plan and returns the result as a pandas DataFrame."""
        return self.to_arrow().to_pandas()

    def count(self):
        """Runs the plan and returns its number of rows."""
        _, pq = _pa()
        d, files = self._files()
        if d.startswith(_REMOTE):
            from ._scan import scan

            return int(scan(d, aggs="count(*)").column(0)[0].as_py())
        return sum(pq.ParquetFile(f).metadata.num_rows for f in files)

    def take(self, n):
        """Runs the plan and returns up to ``n`` rows as dicts."""
        return self.to_arrow().slice(0, int(n)).to_pylist()

    def take_all(self):
        return self.to_arrow().to_pylist()

    def plan_to_json(self):
        """The plan as ``ffkit scan --plan`` reads it (scan stages only; a
        Python-function stage cannot run there)."""
        stages = []
        for node in self._session._order(self._node):
            if node.kind == "source":
                continue
            if node.kind == "py":
                raise ValueError(f"ffkit: stage {node.name} runs a Python function; `ffkit scan --plan` runs scan stages only")
            job = self._session._job(node, refs=True)
            job.pop("workers", None)
            job.pop("retries", None)
            stages.append(dict(job, name=node.name))
        s = self._session
        return json.dumps({"dir": s.data_root, "workers": s.workers, "retries": s.retries, "stages": stages}, indent=1)


class Session:
    """Builds and runs plans (SmallPond's Session; see ``session()``)."""

    def __init__(self, data_root=None, executor="local", ray_address=None, workers=None, retries=2,
                 num_cpus=1, memory=None, ray_scheduling="SPREAD"):
        if executor not in ("local", "ray"):
            raise ValueError(f"ffkit.session: executor {executor!r}: want 'local' or 'ray'")
        self._own_root = data_root is None
        self.data_root = os.fspath(data_root) if data_root is not None else tempfile.mkdtemp(prefix="ffkit-session-")
        self.executor = executor
        self.workers = int(workers or os.cpu_count() or 1)
        self.retries = int(retries)
        self.num_cpus = num_cpus
        self.memory = memory
        self.ray_scheduling = ray_scheduling
        self.ray_address = ray_address
        self.stages_run = []  # names of the stages that did work, in order (for tests and logs)
        self._done = set()  # node keys finished in this session
        self.task_nodes = set()  # the Ray nodes that ran tasks
        self._fps = {}  # node key -> the fingerprint of its published output
        if executor == "ray":
            try:
                import ray
            except ImportError as e:
                raise ImportError("ffkit.session(executor='ray') needs ray (pip install ffkit[ray])") from e
            if not ray.is_initialized():
                ray.init(address=ray_address)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def shutdown(self):
        """Removes the session's data_root if the session made it."""
        if self._own_root:
            shutil.rmtree(self.data_root, ignore_errors=True)

    # --- sources ---

    def read_parquet(self, paths):
        """Parquet files, globs and directories (local or ``ffkit://``), as
        one partition (``repartition`` splits it)."""
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        paths = [os.fspath(p) for p in paths]
        if not paths:
            raise ValueError("ffkit: read_parquet: no paths")
        return DataFrame(self, _Node("source", paths=paths))

    def partial_sql(self, query, *inputs):
        """Runs ``query`` on each partition: ``{0}`` is the partition of the
        first input, ``{1}`` the same partition of the second (both
        repartitioned alike, e.g. ``repartition(n, hash_by=key)``), or all
        of it when the second has one partition (a broadcast join)."""
        if not 1 <= len(inputs) <= 2:
            raise ValueError(f"ffkit: partial_sql takes one or two DataFrames, got {len(inputs)}")
        for d in inputs:
            if not isinstance(d, DataFrame):
                raise TypeError(f"ffkit: partial_sql inputs must be DataFrames, not {type(d).__name__}")
        try:
            sql = query.format("input", "input2")
        except (IndexError, KeyError) as e:
            raise ValueError(f"ffkit: partial_sql: placeholder {e} names no input (use {{0}} and {{1}})") from None
        first = inputs[0]
        nodes = [first._node]
        spec = {"op": "sql", "sql": sql}
        if len(inputs) == 2:
            a, b = first._node, inputs[1]._node
            nodes.append(b)
            if b.nparts == 1:
                spec["broadcast"] = True  # all of {1} beside each partition of {0}
            elif not (a.parted() and b.parted() and a.nparts == b.nparts):
                raise ValueError(f"ffkit: partial_sql: {{1}} has {b.nparts} partitions and {{0}} {a.nparts}: "
                                 "repartition both alike (hash_by the join key), or {1} into 1 (a broadcast)")
        return first._go(spec, inputs=nodes)

    # --- running ---

    def _order(self, node):
        out, seen = [], set()

        def visit(n):
            if n.key in seen:
                return
            seen.add(n.key)
            for i in n.inputs:
                visit(i)
            out.append(n)

        visit(node)
        return out

    def _dir(self, node):
        if node.spec.get("output"):
            return node.spec["output"]
        return _join(self.data_root, node.name)

    def _job(self, node, refs=False):
        """The scan job (plan stage keys) of a "go" node."""
        def src(n):
            if n.kind == "source":
                return list(n.paths)
            return ["@" + n.name] if refs else [self._dir(n)]

        job = {k: v for k, v in node.spec.items() if k != "op"}
        if not node.spec.get("output"):
            # a stage under data_root is read by the next stage: written
            # at zstd's fastest level (half the CPU of the default, a
            # little larger); a repartition's files, which the next stage
            # reads once, uncompressed (a quarter less CPU for the
            # shuffle and its reader, the size of the Arrow data);
            # write_parquet keeps the default
            if node.spec.get("op") == "repartition":
                job["compression"] = "none"
            else:
                job["zstd_level"] = 1
        job["inputs"] = src(node.inputs[0])
        if len(node.inputs) > 1:
            job["join"] = src(node.inputs[1])
        if not refs or node.spec.get("output"):
            job["output"] = self._dir(node)
        job["workers"] = self.workers
        job["retries"] = self.retries if self.retries > 0 else -1
        if not refs:
            # the fingerprints of the stages read, as `scan --plan` salts
            # a stage: the plan_to_json file and the DataFrame agree
            salt = [f"{i.name}={self._fps[i.key]}" for i in node.inputs if i.kind != "source"]
            if salt:
                job["salt"] = ",".join(salt)
        return job

    def _fusable(self, order, target):
        """The sort stages that run with the range repartition they read as
        one job (node key -> the repartition node), and those repartitions'
        keys: on the local executor, a partial_sort(by columns) of a
        range repartition read by nothing else in this run gives the same
        files without writing and reading the repartition's."""
        if self.executor != "local":
            return {}, set()
        readers = {}
        for n in order:
            for i in n.inputs:
                readers[i.key] = readers.get(i.key, 0) + 1
        fused = {}
        for n in order:
            if n.kind != "go" or n.spec.get("op") != "sort" or "sort_by" not in n.spec or n.key in self._done:
                continue
            r = n.inputs[0]
            if (r.kind == "go" and r.spec.get("op") == "repartition" and r is not target and r.key not in self._done
                    and str(r.spec.get("partition_by", "")).startswith("range:") and readers.get(r.key) == 1
                    and not r.spec.get("output")):
                fused[n.key] = r
        return fused, {r.key for r in fused.values()}

    def _run(self, target):
        order = self._order(target)
        fused, skip = self._fusable(order, target)
        for node in order:
            if node.kind == "source" or node.key in self._done or node.key in skip:
                continue
            if node.key in fused:
                ran = self._run_fused(node, fused[node.key])
            elif node.kind == "go":
                ran = self._run_go(node)
            else:
                ran = self._run_py(node)
            if ran:
                self.stages_run.append(node.name)
            self._done.add(node.key)
        if target.kind == "source":
            raise ValueError("ffkit: a DataFrame read straight from files has no stage to run; transform or write it")
        return self._dir(target)

    def _run_fused(self, node, rep):
        """Runs sort stage node and the range repartition rep it reads as
        one scan job (range partitioning with sort_by), writing node's
        directory; rep's is not written."""
        job = self._job(rep)
        sort = {k: v for k, v in node.spec.items() if k not in ("op", "partition_by", "partitions")}
        job.update(sort)
        job.pop("compression", None)
        if not node.spec.get("output"):
            job["zstd_level"] = 1
        job["output"] = self._dir(node)
        sum_ = _scan_job(json.dumps(job))
        self._fps[node.key] = sum_["fingerprint"]
        return not (sum_.get("up_to_date") or sum_.get("tasks_skipped") == sum_.get("tasks"))

    def _run_go(self, node):
        job = json.dumps(self._job(node))
        if self.executor == "local":
            sum_ = _scan_job(job)
            self._fps[node.key] = sum_["fingerprint"]
            return not (sum_.get("up_to_date") or sum_.get("tasks_skipped") == sum_.get("tasks"))
        import ray

        remote = ray.remote(_go_task).options(**self._ray_options())
        ran = False
        while True:
            rep = json.loads(_scan_job(job, "--pending"))
            if not rep["tasks"]:
                self._fps[node.key] = rep["summary"]["fingerprint"]
                return ran
            ran = True
            self.task_nodes.update(ray.get([remote.remote(job, t) for t in rep["tasks"]]))

    def _ray_options(self):
        opts = {"num_cpus": self.num_cpus, "max_retries": max(self.retries, 1) + 2, "retry_exceptions": False}
        if self.memory:
            opts["memory"] = int(self.memory)
        if self.ray_scheduling:
            opts["scheduling_strategy"] = self.ray_scheduling
        return opts

    def _part_files(self, d):
        """The part files of a stage's directory, by partition then name."""
        if d.startswith(_REMOTE):
            return [d]
        names = sorted(n for n in os.listdir(d) if _PART.match(n) and n.endswith(".parquet"))
        return [os.path.join(d, n) for n in names]

    def _py_inputs(self, node):
        """Partition p's input files of a Python stage, for every p."""
        up = node.inputs[0]
        if up.kind == "source":
            return [_expand(up.paths)]
        d = self._dir(up)
        if d.startswith(_REMOTE):
            raise ValueError(f"ffkit: Python-function stages read local or mounted paths, not {d}")
        parts = [[] for _ in range(up.nparts)]
        for f in self._part_files(d):
            parts[int(_PART.match(os.path.basename(f)).group(1))].append(f)
        return parts

    def _run_py(self, node):
        out = self._dir(node)
        if out.startswith(_REMOTE):
            raise ValueError(f"ffkit: Python-function stages write local or mounted paths, not {out}")
        parts = self._py_inputs(node)
        fp = hashlib.sha256(json.dumps([node.key, [[(f, os.path.getsize(f), os.stat(f).st_mtime_ns) for f in p] for p in parts]]).encode()).hexdigest()[:16]
        work = os.path.join(out, "_ffkit")
        jobfile = os.path.join(work, "job.json")
        try:
            with open(jobfile) as f:
                same = json.load(f).get("fingerprint") == fp
        except (OSError, ValueError):
            same = False
        if not same:
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(work)
            _write_atomic(jobfile, json.dumps({"fingerprint": fp, "task": "job"}).encode())
        self._fps[node.key] = fp
        todo = [p for p in range(len(parts)) if not _published(out, fp, p)]
        if not todo:
            return False
        op, fn = node.spec["op"], node.fn
        if self.executor == "local":
            with concurrent.futures.ThreadPoolExecutor(max(1, min(self.workers, len(todo)))) as ex:
                for r in ex.map(lambda p: _py_task(op, fn, parts[p], out, fp, p), todo):
                    pass
        else:
            import ray

            remote = ray.remote(_py_task).options(**self._ray_options())
            self.task_nodes.update(ray.get([remote.remote(op, fn, parts[p], out, fp, p) for p in todo]))
        shutil.rmtree(os.path.join(work, "staging"), ignore_errors=True)  # a killed attempt's leftovers
        return True


def session(data_root=None, executor="local", ray_address=None, workers=None, retries=2, num_cpus=1, memory=None,
            ray_scheduling="SPREAD"):
    """A Session (SmallPond's ``smallpond.init()``).

    Args:
        data_root: where stages write (a directory every executor node
            sees: local, shared, or ``ffkit://HOST:PORT/dir``); default a
            temporary directory removed by ``shutdown()``.
        executor: ``"local"`` (the Go engine, tasks in parallel) or
            ``"ray"`` (each task a Ray task; joins the running
            ``ray.init()`` or connects to ``ray_address``).
        workers: the tasks a scan stage runs at once, and its row-group
            decoders (default: CPUs). Fixes the stages' task lists, so it
            must not change between reruns to reuse their tasks.
        retries: retries of a failed task (Ray also retries a task whose
            worker died).
        num_cpus, memory: the resources each Ray task asks for.
        ray_scheduling: the Ray scheduling strategy of tasks ("SPREAD":
            over every node).
    """
    return Session(data_root, executor, ray_address, workers, retries, num_cpus, memory, ray_scheduling)


def _expand(paths):
    """Local Parquet files of paths, globs and directories (as the engine's
    inputs: a directory's *.parquet, skipping names starting with _ or .)."""
    out = []
    for p in paths:
        if p.startswith(_REMOTE):
            raise ValueError(f"ffkit: Python-function stages read local or mounted paths, not {p}")
        if any(c in p for c in "*?["):
            out += sorted(_glob.glob(p))
        elif os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
                out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".parquet") and not f.startswith(("_", "."))]
        elif os.path.exists(p):
            out.append(p)
        else:
            raise FileNotFoundError(f"ffkit: read_parquet: {p} does not exist")
    return out


def _scan_job(job, *flags):
    """Runs `ffkit scan --job - [flags] --json` and returns its output."""
    from . import _engine, errors

    args = [_engine.binary_path(), "--json", "scan", "--job", "-", *flags]
    p = subprocess.run(args, input=job.encode(), capture_output=True)
    if p.returncode != 0:
        msg = p.stderr.decode(errors="replace").strip()
        cls = errors.UsageError if p.returncode == 2 else errors.FFKitError
        raise cls(f"ffkit: scan job failed (exit {p.returncode}): {msg}")
    if not flags:
        return json.loads(p.stdout)
    return p.stdout.decode()


def _go_task(job, task):
    """A Ray task: one task of a scan job, run by this node's engine."""
    _scan_job(job, "--task", task)
    return _node_id()


def _node_id():
    """The Ray node running this task (None outside Ray: asking Ray then
    would start or join a cluster)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def _marker(out, p):
    return os.path.join(out, "_ffkit", "tasks", f"part-{p:05d}.json")


def _published(out, fp, p):
    try:
        with open(_marker(out, p)) as f:
            m = json.load(f)
    except (OSError, ValueError):
        return False
    return m.get("fingerprint") == fp and all(os.path.exists(os.path.join(out, n)) for n in m.get("files", []))


def _write_atomic(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _apply(op, fn, table):
    pa, _ = _pa()
    if op == "map_batches":
        out = fn(table)
        if not isinstance(out, pa.Table):
            if isinstance(out, pa.RecordBatch):
                return pa.Table.from_batches([out])
            raise TypeError(f"ffkit: map_batches function returned {type(out).__name__}, want a pyarrow.Table")
        return out
    rows = table.to_pylist()
    if op == "filter":
        return table.filter(pa.array([bool(fn(r)) for r in rows], pa.bool_()))
    if op == "map":
        res = [fn(r) for r in rows]
    else:  # flat_map
        res = [x for r in rows for x in fn(r)]
    return pa.Table.from_pylist(res) if res else None


def _py_task(op, fn, files, out, fp, p):
    """Partition p of a Python-function stage: read its files, apply fn
    batch by batch, write part-PPPPP.parquet through a staging directory,
    rename it into place, then write the marker."""
    pa, pq = _pa()
    name = f"part-{p:05d}.parquet"
    stage = os.path.join(out, "_ffkit", "staging", f"part-{p:05d}.{fp[:8]}.{os.getpid()}")
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    writer, rows, schema = None, 0, None
    try:
        for f in files:
            pf = pq.ParquetFile(f)
            if schema is None:
                schema = pf.schema_arrow
            for batch in pf.iter_batches(batch_size=65536):
                res = _apply(op, fn, pa.Table.from_batches([batch]))
                if res is None or res.num_rows == 0 and writer is not None:
                    continue
                if writer is None:
                    writer = pq.ParquetWriter(os.path.join(stage, name), res.schema, compression="zstd")
                elif res.schema != writer.schema:
                    res = res.cast(writer.schema)
                writer.write_table(res)
                rows += res.num_rows
        if writer is None and op == "filter" and schema is not None:
            # an empty partition keeps the columns
            writer = pq.ParquetWriter(os.path.join(stage, name), schema, compression="zstd")
        files_out = []
        if writer is not None:
            writer.close()
            writer = None
            os.replace(os.path.join(stage, name), os.path.join(out, name))
            files_out = [name]
        _write_atomic(_marker(out, p), json.dumps({"fingerprint": fp, "task": f"part-{p:05d}", "files": files_out, "rows": rows}).encode())
    finally:
        if writer is not None:
            writer.close()
        shutil.rmtree(stage, ignore_errors=True)
    return _node_id()
