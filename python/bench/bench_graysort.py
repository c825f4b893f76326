"""A GraySort-style sort: N GiB of 100-byte records (a 10-byte random binary
key, a 90-byte payload), range-partitioned by sampled keys into P
partitions, each partition sorted, written as Parquet. The same run times:

- ffkit, local executor: read -> repartition(P, range_by="key",
  bounds=sampled) (the Go engine's shuffle) -> partial_sort("key") (the
  engine's native sort per partition); the sorted partitions are the last
  stage's Parquet files (zstd level 1, as every stage under data_root);
- ffkit, Ray executor: the same plan as Ray tasks on a Ray cluster of
  --ray-nodes nodes (one CPU each) on this machine;
- DuckDB: COPY (SELECT * FROM input ORDER BY key) TO one Parquet file,
  zstd at --duck-zstd-level (default 1: the same codec and level as
  ffkit's output; 0: DuckDB's default level);
- SmallPond (with --smallpond-python, a Python that imports smallpond):
  its DataFrame API on the same input: partial_sql computes each row's
  range partition from the same bounds, repartition(P, by=...) shuffles,
  partial_sort sorts each partition.

Each round runs every contender once, alternating the order; medians are
printed as MiB/s per core (record bytes / seconds / --cores), and, for
ffkit local and DuckDB, MiB per CPU second used (user + system of this
process and its engine processes; robust to other load on the machine). SmallPond's
published GraySort is 6.6 MiB/s per core (110.5 TiB in 30 min 14 s on
50 x 192 cores).

    python3 python/bench/bench_graysort.py [--gib 1] [--parts 16]
        [--rounds 1] [--ray-nodes 2] [--smallpond-python PY] [--dir D]
        [--duck-zstd-level 1]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REC = 100
KEY = 10

SMALLPOND = r"""
import json, sys, time
import smallpond
a = json.loads(sys.argv[1])
t0 = time.perf_counter()
sp = smallpond.init(data_root=a["root"], num_executors=0, bind_numa_node=False)
df = sp.read_parquet(a["input"])
case = " ".join(f"WHEN key < from_hex('{b}') THEN {i}" for i, b in enumerate(a["bounds"]))
df = sp.partial_sql(f"SELECT *, (CASE {case} ELSE {len(a['bounds'])} END)::INTEGER AS p FROM {{0}}", df)
df = df.repartition(a["parts"], by="p")
df = sp.partial_sql("SELECT key, payload FROM {0} ORDER BY key", df)
df.write_parquet(a["out"])
print("GRAYSORT_SECONDS", time.perf_counter() - t0, flush=True)
"""


def generate(d, gib, files):
    """files Parquet files of random 100-byte records (zstd)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = int(gib * (1 << 30)) // REC
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(20)
    per = -(-rows // files)
    for f in range(files):
        n = min(per, rows - f * per)
        keys = rng.integers(0, 256, size=n * KEY, dtype=np.uint8).tobytes()
        # the payload, as gensort's: printable, compressible
        pay = rng.integers(65, 91, size=n * (REC - KEY), dtype=np.uint8).tobytes()
        k = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer((np.arange(n + 1, dtype=np.int32) * KEY).tobytes()), pa.py_buffer(keys)])
        p = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer((np.arange(n + 1, dtype=np.int32) * (REC - KEY)).tobytes()), pa.py_buffer(pay)])
        pq.write_table(pa.table({"key": k, "payload": p}), os.path.join(d, f"in-{f:03d}.parquet"),
                       compression="zstd", row_group_size=1 << 20)
    return rows


def sample_bounds(d, parts, per_file=4096):
    """parts-1 bounds: quantiles of a sample of the keys of every file."""
    import pyarrow.parquet as pq

    sample = []
    for n in sorted(os.listdir(d)):
        pf = pq.ParquetFile(os.path.join(d, n))
        keys = pf.read_row_group(0, columns=["key"]).column(0)
        step = max(1, len(keys) // per_file)
        sample += [keys[i].as_py() for i in range(0, len(keys), step)]
    sample.sort()
    return [sample[len(sample) * q // parts] for q in range(1, parts)]


def check_sorted(files, rows):
    """The partition files in order hold rows rows in key order."""
    import pyarrow.parquet as pq

    total, last = 0, b""
    for f in files:
        t = pq.read_table(f, columns=["key"])
        ks = t.column(0).to_pylist()
        if ks:
            assert ks[0] >= last and ks == sorted(ks), f"{f} is not sorted after its predecessors"
            last = ks[-1]
        total += len(ks)
    assert total == rows, (total, rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--parts", type=int, default=16)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ray-nodes", type=int, default=2)
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--smallpond-python", default="")
    ap.add_argument("--only", default="local,ray,duckdb,smallpond")
    ap.add_argument("--dir", default="")
    ap.add_argument("--duck-zstd-level", type=int, default=1,
                    help="DuckDB's zstd level (1: as ffkit writes its output; 0: DuckDB's default)")
    ap.add_argument("--check", action="store_true", help="check ffkit's output is sorted (reads it all back)")
    a = ap.parse_args()

    import duckdb

    import ffkit

    own = not a.dir
    tmp = a.dir or tempfile.mkdtemp(prefix="ffkit-graysort-")
    indir = os.path.join(tmp, f"in-{a.gib:g}g")
    if not os.path.isdir(indir):
        t0 = time.perf_counter()
        generate(indir + ".tmp", a.gib, a.files)
        os.rename(indir + ".tmp", indir)
        print(f"generated {a.gib:g} GiB in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    rows = sum(__import__("pyarrow.parquet").parquet.ParquetFile(os.path.join(indir, n)).metadata.num_rows
               for n in os.listdir(indir))
    mib = rows * REC / (1 << 20)
    bounds = sample_bounds(indir, a.parts)
    only = set(a.only.split(","))
    if not a.smallpond_python:
        only.discard("smallpond")

    cluster = None
    if "ray" in only:
        import _raycluster

        cluster = _raycluster.start(a.ray_nodes)

    def cpu():
        """CPU seconds used so far by this process and its waited-for children."""
        t = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            r = resource.getrusage(who)
            t += r.ru_utime + r.ru_stime
        return t

    def ours(executor):
        root = os.path.join(tmp, "root-" + executor)
        shutil.rmtree(root, ignore_errors=True)
        t0, c0 = time.perf_counter(), cpu()
        with ffkit.session(data_root=root, executor=executor, workers=a.cores) as sp:
            df = sp.read_parquet(indir).repartition(a.parts, range_by="key", bounds=bounds).partial_sort("key")
            out = df.compute()
            secs = time.perf_counter() - t0
            if executor == "local":  # Ray's workers are not our children
                cpus[executor].append(cpu() - c0)
            if a.check:
                check_sorted(sp._part_files(out), rows)
        shutil.rmtree(root, ignore_errors=True)
        return secs

    def duck():
        out = os.path.join(tmp, "duck.parquet")
        level = f", COMPRESSION_LEVEL {a.duck_zstd_level}" if a.duck_zstd_level else ""
        t0, c0 = time.perf_counter(), cpu()
        con = duckdb.connect()
        con.execute(f"SET threads={a.cores}")
        con.execute(f"SET temp_directory='{tmp}/duck-tmp'")
        con.execute(f"COPY (SELECT * FROM read_parquet('{indir}/*.parquet') ORDER BY key) TO '{out}' (FORMAT parquet, COMPRESSION zstd{level})")
        secs = time.perf_counter() - t0
        cpus["duckdb"].append(cpu() - c0)
        con.close()
        os.remove(out)
        shutil.rmtree(f"{tmp}/duck-tmp", ignore_errors=True)
        return secs

    def smallpond():
        root, out = os.path.join(tmp, "root-sp"), os.path.join(tmp, "out-sp")
        for d in (root, out):
            shutil.rmtree(d, ignore_errors=True)
        arg = json.dumps({"root": root, "out": out, "input": f"{indir}/*.parquet", "parts": a.parts,
                          "cores": a.cores, "bounds": [b.hex() for b in bounds]})
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
        p = subprocess.run([a.smallpond_python, "-c", SMALLPOND, arg], capture_output=True, env=env)
        if p.returncode != 0:
            raise RuntimeError(f"smallpond failed (exit {p.returncode}): {p.stderr.decode(errors='replace')[-3000:]}")
        for d in (root, out):
            shutil.rmtree(d, ignore_errors=True)
        return float(next(l for l in p.stdout.decode().splitlines() if l.startswith("GRAYSORT_SECONDS")).split()[1])

    runs = {"local": lambda: ours("local"), "ray": lambda: ours("ray"), "duckdb": duck, "smallpond": smallpond}
    order = [c for c in ["local", "ray", "duckdb", "smallpond"] if c in only]
    times = {c: [] for c in order}
    cpus = {c: [] for c in runs}
    errors = {}
    try:
        for r in range(a.rounds):
            for c in (order if r % 2 == 0 else order[::-1]):
                if c in errors:
                    continue
                try:
                    times[c].append(runs[c]())
                except Exception as e:  # report, and go on with the others
                    errors[c] = str(e)
                used = f" (cpu {cpus[c][-1]:.2f} s)" if c not in errors and cpus.get(c) else ""
                print(f"round {r} {c}: {times[c][-1] if c not in errors else errors[c][:200]}{used}", file=sys.stderr)
    finally:
        if cluster is not None:
            import ray

            ray.shutdown()
            cluster.shutdown()
        if own:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"GraySort: {rows:,} records of {REC} bytes ({mib:,.0f} MiB), {a.parts} range partitions, "
          f"{a.cores} cores, {a.rounds} rounds; medians")
    print(f"{'contender':<22} {'seconds':>8} {'MiB/s/core':>10} {'vs duckdb':>9} {'cpu s':>7} {'MiB/cpu-s':>9} {'cpu vs duckdb':>13}")
    base = statistics.median(times["duckdb"]) if times.get("duckdb") else None
    cbase = statistics.median(cpus["duckdb"]) if cpus.get("duckdb") else None
    names = {"local": "ffkit local", "ray": f"ffkit ray ({a.ray_nodes} nodes)", "duckdb": "duckdb ORDER BY",
             "smallpond": "smallpond"}
    for c in order:
        if c in errors:
            print(f"{names[c]:<22} failed: {errors[c][-300:]}")
            continue
        s = statistics.median(times[c])
        vs = f"{base / s:>8.2f}x" if base else ""
        line = f"{names[c]:<22} {s:>8.2f} {mib / s / a.cores:>10.1f} {vs}"
        if cpus.get(c):  # Ray's and SmallPond's workers are not our children
            cs = statistics.median(cpus[c])
            line += f" {cs:>7.2f} {mib / cs:>9.1f}" + (f" {cbase / cs:>12.2f}x" if cbase else "")
        print(line)
    if times.get("local") and times.get("duckdb") and a.rounds > 1:
        # the ratio of each round's pair, then the median (robust to load
        # that changes between rounds)
        rs = [d / l for l, d in zip(times["local"], times["duckdb"])]
        cr = [d / l for l, d in zip(cpus["local"], cpus["duckdb"])]
        print(f"ffkit local vs duckdb, median of per-round ratios: wall {statistics.median(rs):.2f}x "
              f"({', '.join(f'{r:.2f}' for r in rs)}), cpu {statistics.median(cr):.2f}x ({', '.join(f'{r:.2f}' for r in cr)})")
    print("SmallPond's published GraySort: 6.6 MiB/s per core (110.5 TiB / 30 min 14 s / 9,600 cores)")


if __name__ == "__main__":
    main()
