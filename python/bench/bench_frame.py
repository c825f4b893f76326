"""Per-task cost of the DataFrame's executors: the same pipeline with 8, 64
and 512 partitions on the local executor and on Ray (two nodes on this
machine), beside DuckDB running the same query on the same input.

The pipeline: read -> repartition(P, hash_by=k) -> partial_sql aggregate
-> count. Each round runs every contender once in alternating order, in a
fresh data_root (nothing reused); the medians are printed with the Ray
overhead per task: (ray s - local s) / tasks.

    python3 python/bench/bench_frame.py [--rows 2000000] [--parts 8,64,512]
        [--rounds 3] [--ray-nodes 2]
"""
import argparse
import os
import shutil
import statistics
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--parts", default="8,64,512")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ray-nodes", type=int, default=2)
    a = ap.parse_args()

    import duckdb
    import ray

    import _raycluster
    import ffkit

    tmp = tempfile.mkdtemp(prefix="ffkit-bench-frame-")
    src = os.path.join(tmp, "in.parquet")
    duckdb.sql(f"COPY (SELECT i AS id, i % 1000 AS k, random() AS v FROM range({a.rows}) t(i)) "
               f"TO '{src}' (FORMAT parquet, ROW_GROUP_SIZE 122880)")
    cluster = _raycluster.start(a.ray_nodes)
    query = "SELECT k, count(*) AS n, sum(v) AS s FROM {0} GROUP BY k"

    def run(executor, parts):
        root = os.path.join(tmp, "root")
        shutil.rmtree(root, ignore_errors=True)
        t0 = time.perf_counter()
        with ffkit.session(data_root=root, executor=executor, workers=2) as sp:
            df = sp.read_parquet(src).repartition(parts, hash_by="k")
            n = sp.partial_sql(query, df).count()
        assert n == 1000, n
        return time.perf_counter() - t0

    def duck():
        t0 = time.perf_counter()
        con = duckdb.connect()
        con.execute("SET threads=2")
        con.execute(f"COPY (SELECT k, count(*) AS n, sum(v) AS s FROM read_parquet('{src}') GROUP BY k) "
                    f"TO '{tmp}/duck.parquet' (FORMAT parquet)")
        return time.perf_counter() - t0

    try:
        print(f"{a.rows:,} rows, {a.ray_nodes} Ray nodes of 1 CPU, {a.rounds} rounds; medians in seconds")
        print(f"{'partitions':>10} {'tasks':>6} {'local':>8} {'ray':>8} {'duckdb':>8} {'ray/local':>9} {'ray s/task':>10}")
        for parts in [int(p) for p in a.parts.split(",")]:
            times = {"local": [], "ray": [], "duckdb": []}
            for r in range(a.rounds):
                order = ["local", "ray", "duckdb"] if r % 2 == 0 else ["duckdb", "ray", "local"]
                for c in order:
                    times[c].append(duck() if c == "duckdb" else run(c, parts))
            m = {c: statistics.median(v) for c, v in times.items()}
            # producers (2 x workers) + one SQL task per partition (+ schema-only
            # files for empty partitions, none here)
            tasks = min(4, -(-a.rows // 122880)) + parts
            print(f"{parts:>10} {tasks:>6} {m['local']:>8.2f} {m['ray']:>8.2f} {m['duckdb']:>8.2f} "
                  f"{m['ray'] / m['local']:>8.2f}x {(m['ray'] - m['local']) / tasks:>10.3f}")
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
