"""ffkit's DataFrame (SmallPond's API) on the local executor and on a
two-node Ray cluster on this machine, checked against DuckDB."""
import json
import os
import secrets
import shutil
import signal
import subprocess
import threading

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb")

import ffkit  # noqa: E402
from ffkit import _engine  # noqa: E402

NKEYS = 37


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three Parquet files of 6000 rows: id, k (37 keys), v, s; and a small
    dimension table dim(k, label)."""
    d = tmp_path_factory.mktemp("frame_in")
    for f in range(3):
        ids = list(range(f * 6000, (f + 1) * 6000))
        t = pa.table({"id": ids, "k": [i % NKEYS for i in ids], "v": [i * 0.5 for i in ids],
                      "s": [f"s{i % 11}" for i in ids]})
        pq.write_table(t, d / f"in{f}.parquet", row_group_size=2000)
    pq.write_table(pa.table({"k": list(range(0, NKEYS, 2)), "label": [f"L{k}" for k in range(0, NKEYS, 2)]}), d / "_dim.parquet")  # _: not part of the directory
    return str(d)


def duck(sql, data):
    con = duckdb.connect()
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet('{data}/in*.parquet')")
    con.execute(f"CREATE VIEW dim AS SELECT * FROM read_parquet('{data}/_dim.parquet')")
    cur = con.execute(sql)
    cols = [d[0] for d in cur.description]
    return pa.Table.from_pylist([dict(zip(cols, r)) for r in cur.fetchall()])


def rows(table, order):
    return sorted(table.to_pylist(), key=lambda r: tuple(r[c] for c in order))


def pipeline(sp, data):
    """read -> hash repartition -> partial_sql aggregate; and a
    co-partitioned join of the aggregate with the repartitioned rows."""
    df = sp.read_parquet(os.path.join(data, "in*.parquet"))
    by_k = df.repartition(4, hash_by="k")
    agg = sp.partial_sql("SELECT k, count(*) AS n, sum(v) AS sv FROM {0} GROUP BY k", by_k)
    joined = sp.partial_sql("SELECT a.id, a.k, b.n FROM {0} a JOIN {1} b USING (k)", by_k, agg)
    return agg, joined


def by_k_of(agg):
    from ffkit._frame import DataFrame

    return DataFrame(agg._session, agg._node.inputs[0])


AGG = "SELECT k, count(*) AS n, sum(v) AS sv FROM t GROUP BY k"
JOINED = f"SELECT a.id, a.k, b.n FROM t a JOIN ({AGG}) b USING (k)"


def test_local_pipeline_matches_duckdb(data, tmp_path):
    with ffkit.session(data_root=str(tmp_path / "root"), workers=2) as sp:
        agg, joined = pipeline(sp, data)
        assert agg.num_partitions == 4
        assert rows(agg.to_arrow(), ["k"]) == rows(duck(AGG, data), ["k"])
        assert rows(joined.to_arrow(), ["id"]) == rows(duck(JOINED, data), ["id"])
        assert joined.count() == 18000
        # each hash partition holds whole keys
        where = {}
        for f in sp._part_files(by_k_of(agg).compute()):
            for k in pq.read_table(f).column("k").to_pylist():
                where.setdefault(k, set()).add(os.path.basename(f)[:10])
        assert len(where) == NKEYS and all(len(p) == 1 for p in where.values())
        # writing: a directory of part files, and one file
        out = agg.write_parquet(str(tmp_path / "agg_out"))
        assert rows(pq.read_table(out), ["k"]) == rows(duck(AGG, data), ["k"])
        one = joined.write_parquet(str(tmp_path / "joined.parquet"))
        assert pq.ParquetFile(one).metadata.num_rows == 18000


def test_operations(data, tmp_path):
    with ffkit.session(data_root=str(tmp_path / "root"), workers=2) as sp:
        df = sp.read_parquet(data)  # a directory
        parts = df.repartition(3, by_rows=True)
        assert parts.count() == 18000 and parts.num_partitions == 3
        # SQL and Python versions of filter / map / flat_map agree
        f_sql = parts.filter("k % 2 = 0 AND v > 10")
        f_py = parts.filter(lambda r: r["k"] % 2 == 0 and r["v"] > 10)
        assert rows(f_sql.to_arrow(), ["id"]) == rows(f_py.to_arrow(), ["id"])
        m_sql = parts.map("id, v * 2 AS w")
        m_py = parts.map(lambda r: {"id": r["id"], "w": r["v"] * 2})
        assert rows(m_sql.to_arrow(), ["id"]) == rows(m_py.to_arrow(), ["id"])
        fm_py = parts.flat_map(lambda r: [{"id": r["id"], "j": j} for j in range(r["id"] % 3)])
        fm_sql = parts.flat_map("id, unnest(range(id % 3)) AS j")
        assert rows(fm_py.to_arrow(), ["id", "j"]) == rows(fm_sql.to_arrow(), ["id", "j"])
        assert fm_py.count() == sum(i % 3 for i in range(18000))
        mb = parts.map_batches(lambda t: t.append_column("one", pa.array([1] * t.num_rows, pa.int64())))
        assert mb.to_arrow().column("one").to_pylist() == [1] * 18000
        # partial_sort sorts each partition; limit; take; to_pandas
        srt = parts.partial_sort("v DESC")
        for f in sp._part_files(srt.compute()):
            vs = pq.read_table(f).column("v").to_pylist()
            assert vs == sorted(vs, reverse=True)
        assert srt.take(2) == [{"id": 5999, "k": 5999 % NKEYS, "v": 2999.5, "s": "s4"},
                               {"id": 5998, "k": 5998 % NKEYS, "v": 2999.0, "s": "s3"}]
        assert parts.limit(7).count() == 7
        assert len(parts.to_pandas()) == 18000
        # repartition by an integer column's value; a broadcast join
        byv = df.repartition(NKEYS, by="k")
        for f in sp._part_files(byv.compute()):
            assert set(pq.read_table(f).column("k").to_pylist()) <= {int(os.path.basename(f)[5:10])}
        dim = sp.read_parquet(os.path.join(data, "_dim.parquet"))
        b = sp.partial_sql("SELECT a.id, d.label FROM {0} a JOIN {1} d USING (k)", parts, dim)
        assert rows(b.to_arrow(), ["id"]) == rows(duck("SELECT a.id, d.label FROM t a JOIN dim d USING (k)", data), ["id"])
        # FFRecord out
        packed = parts.map("s").write_ffrecord(str(tmp_path / "packed"), sample_column="s")
        from ffkit.ffrecord import FileReader

        names = sorted(n for n in os.listdir(packed) if n.endswith(".ffr"))
        assert sum(FileReader(os.path.join(packed, n)).n for n in names) == 18000


def test_errors(data, tmp_path):
    with ffkit.session(data_root=str(tmp_path / "root"), workers=2) as sp:
        df = sp.read_parquet(data)
        with pytest.raises(ValueError, match="repartition both alike"):
            sp.partial_sql("SELECT * FROM {0} JOIN {1} USING (k)", df.repartition(2, hash_by="k"), df.repartition(3, hash_by="k"))
        with pytest.raises(ValueError, match="placeholder"):
            sp.partial_sql("SELECT * FROM {2}", df)
        with pytest.raises(ffkit.errors.UsageError, match="nope"):
            df.filter("nope > 1").count()
        with pytest.raises(TypeError):
            df.map(42)
        with pytest.raises(ValueError, match="one of"):
            df.repartition(2, hash_by="k", by_rows=True)


def test_rerun_recomputes_only_changed_stages(data, tmp_path):
    root = str(tmp_path / "root")

    def run(query):
        with ffkit.session(data_root=root, workers=2) as sp:
            df = sp.read_parquet(data).repartition(3, hash_by="k")
            out = sp.partial_sql(query, df).filter(lambda r: r["n"] > 0)
            res = rows(out.to_arrow(), ["k"])
            return sp.stages_run, res

    q1 = "SELECT k, count(*) AS n FROM {0} GROUP BY k"
    ran, res = run(q1)
    assert len(ran) == 3 and len(res) == NKEYS
    ran, _ = run(q1)
    assert ran == []  # nothing changed: every stage reused
    ran, res = run("SELECT k, max(id) AS n FROM {0} GROUP BY k")
    assert len(ran) == 2 and ran[0].startswith("go-sql") and ran[1].startswith("py-filter")
    assert rows(pa.Table.from_pylist(res), ["k"]) == rows(duck("SELECT k, max(id) AS n FROM t GROUP BY k", data), ["k"])


def test_plan_to_json_runs_in_the_cli(data, tmp_path):
    with ffkit.session(data_root=str(tmp_path / "root"), workers=2) as sp:
        agg, joined = pipeline(sp, data)
        plan = json.loads(joined.plan_to_json())
        assert [s["name"].split("-")[1] for s in plan["stages"]] == ["repartition", "sql", "sql"]
        path = tmp_path / "plan.json"
        path.write_text(json.dumps(plan))
        p = subprocess.run([_engine.binary_path(), "--json", "scan", "--plan", str(path)], capture_output=True)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout)["ran"] == 3
        # the plan wrote where the DataFrame looks: nothing left to run
        assert rows(joined.to_arrow(), ["id"]) == rows(duck(JOINED, data), ["id"])
        assert sp.stages_run == []
        with pytest.raises(ValueError, match="Python function"):
            agg.map(lambda r: r).plan_to_json()


# --- Ray ---


@pytest.fixture(scope="module")
def cluster_token():
    """The token of the ffkit cluster the Ray tests start, in FFKIT_TOKEN
    before the Ray nodes start, so their workers' engines have it."""
    tok = secrets.token_hex(32)
    old = os.environ.get("FFKIT_TOKEN")
    os.environ["FFKIT_TOKEN"] = tok
    restart_engine()  # this process's helper engine reads the cluster too
    yield tok
    if old is None:
        os.environ.pop("FFKIT_TOKEN", None)
    else:
        os.environ["FFKIT_TOKEN"] = old
    restart_engine()


def restart_engine():
    """Stops this process's helper engine (if started), so the next call
    starts one with the current environment."""
    e = _engine._current
    if e is not None and not e.dead:
        e.shutdown()


@pytest.fixture(scope="module")
def ffkit_cluster(tmp_path_factory, cluster_token):
    """An ffkit cluster (`ffkit fs up`: mgmtd, metadata and storage
    processes) on this machine; yields its URL. Its token file holds
    cluster_token; its HOME is private, so the user's tokens.json is not
    touched."""
    d = tmp_path_factory.mktemp("ffkit_cluster")
    home = d / "home"
    home.mkdir()
    cdir = d / "cluster"
    cdir.mkdir(mode=0o700)
    tf = cdir / "token"
    tf.write_text(cluster_token + "\n")
    tf.chmod(0o600)
    env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
    p = subprocess.Popen([_engine.binary_path(), "fs", "up", "--dir", str(cdir), "--storage", "2", "--replicas", "2",
                          "--targets-per-storage", "1", "--heartbeat", "200ms", "--chunk-size", "1MiB"],
                         stdout=subprocess.PIPE, stderr=open(d / "up.log", "wb"), env=env)
    try:
        url = p.stdout.readline().decode().strip()  # printed once the cluster is ready
        if not url.startswith("ffkit://"):
            p.wait()
            pytest.fail(f"ffkit fs up did not start (exit {p.returncode}): {(d / 'up.log').read_text()[-3000:]}")
        # keep reading its stdout, so it never blocks on a full pipe
        threading.Thread(target=p.stdout.read, daemon=True).start()
        yield url
    finally:
        p.terminate()
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def fs(*args):
    p = subprocess.run([_engine.binary_path(), "fs", *args], capture_output=True)
    assert p.returncode == 0, f"ffkit fs {args}: {p.stderr.decode()}"
    return p.stdout.decode()


@pytest.fixture(scope="module")
def ray_cluster(cluster_token):
    """A Ray cluster of two nodes (one CPU each) on this machine."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    # the nodes' workers import ffkit as this process does
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(ffkit.__file__)),
                                                           os.environ.get("PYTHONPATH", "")] if p)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    args = {"num_cpus": 1, "object_store_memory": 80 << 20}
    cluster = Cluster(initialize_head=True, head_node_args=dict(args, include_dashboard=False))
    try:
        cluster.add_node(**args)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        yield ray
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_ray_two_nodes_same_as_local(data, tmp_path, ray_cluster):
    with ffkit.session(data_root=str(tmp_path / "local"), workers=2) as sp:
        agg, joined = pipeline(sp, data)
        local = {"agg": rows(agg.to_arrow(), ["k"]), "joined": rows(joined.to_arrow(), ["id"])}
        local_files = [os.path.basename(f) for f in sp._part_files(joined.compute())]
    with ffkit.session(data_root=str(tmp_path / "ray"), executor="ray", workers=2) as sp:
        agg, joined = pipeline(sp, data)
        assert rows(agg.to_arrow(), ["k"]) == local["agg"] == rows(duck(AGG, data), ["k"])
        assert rows(joined.to_arrow(), ["id"]) == local["joined"]
        assert [os.path.basename(f) for f in sp._part_files(joined.compute())] == local_files
        assert len(sp.task_nodes) == 2, "the tasks ran on one node"
        assert len(ray_cluster.nodes()) == 2


def test_ray_worker_killed_mid_job(data, tmp_path, ray_cluster):
    flag = str(tmp_path / "killed-once")
    driver = os.getpid()

    def die_once(t):
        # the first task to get here kills its own Ray worker (SIGKILL):
        # Ray retries the task on a fresh worker
        if os.getpid() != driver and not os.path.exists(flag):
            open(flag, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return t

    with ffkit.session(data_root=str(tmp_path / "ray"), executor="ray", workers=2) as sp:
        df = sp.read_parquet(data).repartition(4, hash_by="k").map_batches(die_once)
        out = sp.partial_sql("SELECT k, count(*) AS n, sum(v) AS sv FROM {0} GROUP BY k", df)
        assert rows(out.to_arrow(), ["k"]) == rows(duck(AGG, data), ["k"])
    assert os.path.exists(flag)


def unstamped(path):
    """A part file's bytes with its job fingerprint (a hash of the input
    paths, sizes and times, in the key-value metadata) blanked."""
    fp = pq.ParquetFile(path).metadata.metadata[b"ffkit.fingerprint"]
    b = open(path, "rb").read()
    assert b.count(fp) == 1
    return b.replace(fp, b"0" * len(fp))


def test_ray_on_ffkit_cluster(data, tmp_path, ffkit_cluster, ray_cluster):
    """The three-stage pipeline and the co-partitioned join on two Ray
    nodes, reading and writing an ffkit:// cluster: DuckDB's answers, and
    byte for byte the part files the local executor writes from local
    input. FFKIT_FRAME_CLUSTER_ROWS=N runs it on N rows instead of 18,000."""
    url = ffkit_cluster
    n = int(os.environ.get("FFKIT_FRAME_CLUSTER_ROWS") or 0)
    if n:
        small, data = data, str(tmp_path / "big")
        os.mkdir(data)
        shutil.copy(os.path.join(small, "_dim.parquet"), data)
        for f in range(3):
            ids = np.arange(f * n // 3, (f + 1) * n // 3, dtype=np.int64)
            t = pa.table({"id": ids, "k": ids % NKEYS, "v": ids * 0.5})
            pq.write_table(t, os.path.join(data, f"in{f}.parquet"), row_group_size=100_000)
    fs("put", data, url + "/in")
    outs = {}
    with ffkit.session(data_root=url + "/root", executor="ray", workers=2) as sp:
        df = sp.read_parquet(url + "/in")
        by_k = df.repartition(4, hash_by="k")
        agg = sp.partial_sql("SELECT k, count(*) AS n, sum(v) AS sv FROM {0} GROUP BY k", by_k)
        joined = sp.partial_sql("SELECT a.id, a.k, b.n FROM {0} a JOIN {1} b USING (k)", by_k, agg)
        outs["agg"] = agg.write_parquet(url + "/out/agg")
        outs["joined"] = joined.write_parquet(url + "/out/joined")
        assert rows(agg.to_arrow(), ["k"]) == rows(duck(AGG, data), ["k"])
        assert rows(joined.to_arrow(), ["id"]) == rows(duck(JOINED, data), ["id"])
        assert joined.count() == (n or 18000)
        assert len(sp.task_nodes) == 2, "the tasks ran on one node"
        assert len(sp.stages_run) == 5
    got = tmp_path / "got"
    got.mkdir()
    fs("get", url + "/out", str(got))
    with ffkit.session(data_root=str(tmp_path / "local"), workers=2) as sp:
        agg, joined = pipeline(sp, data)
        for name, frame in (("agg", agg), ("joined", joined)):
            local = frame.write_parquet(str(tmp_path / "local-out" / name))
            parts = sorted(n for n in os.listdir(local) if n.startswith("part-"))
            remote = sorted(n for n in os.listdir(got / "out" / name) if n.startswith("part-"))
            assert parts == remote and len(parts) == 4, name
            for n in parts:
                a, b = unstamped(os.path.join(local, n)), unstamped(str(got / "out" / name / n))
                assert a == b, f"{name}/{n} differs between the local executor and Ray on the cluster"
        assert rows(agg.to_arrow(), ["k"]) == rows(duck(AGG, data), ["k"])


def test_graysort_binary_records(tmp_path):
    """GraySort's records: 10-byte binary keys (some repeated) and 90-byte
    payloads in zstd files written with pyarrow's dictionary (which
    overflows into plain pages), range-partitioned at sampled bounds and
    sorted by the engine: the partitions in order hold DuckDB's ORDER BY
    key sequence and the same multiset of records."""
    rng = np.random.default_rng(7)
    d = tmp_path / "in"
    d.mkdir()
    for f in range(3):
        n = 9000
        keys = rng.integers(0, 256, size=(n, 10), dtype=np.uint8)
        keys[::97] = keys[0]  # repeated keys, with different payloads
        pay = rng.integers(65, 91, size=(n, 90), dtype=np.uint8)
        t = pa.table({"key": pa.array([bytes(k) for k in keys], pa.binary()),
                      "payload": pa.array([bytes(p) for p in pay], pa.binary())})
        pq.write_table(t, str(d / f"in-{f}.parquet"), compression="zstd", row_group_size=4000,
                       data_page_size=64 << 10, dictionary_pagesize_limit=32 << 10)
    con = duckdb.connect()
    want = con.execute(f"SELECT key, payload FROM read_parquet('{d}/*.parquet') ORDER BY key").fetchall()
    ks = sorted(k for k, _ in want)
    bounds = [ks[len(ks) * q // 5] for q in range(1, 5)]
    with ffkit.session(data_root=str(tmp_path / "root"), workers=2) as sp:
        srt = sp.read_parquet(str(d)).repartition(5, range_by="key", bounds=bounds).partial_sort("key")
        got = [(r["key"], r["payload"]) for f in sp._part_files(srt.compute()) for r in pq.read_table(f).to_pylist()]
    assert [k for k, _ in got] == [k for k, _ in want], "the partitions in order are not in key order"
    assert sorted(got) == sorted(want), "the records differ from the input's"


def test_range_repartition_then_partial_sort(data, tmp_path):
    """GraySort's shape: range partitions at sampled bounds, each sorted:
    the partitions in order are the whole input sorted."""
    with ffkit.session(data_root=str(tmp_path / "root"), workers=2) as sp:
        df = sp.partial_sql("SELECT id, s || '-' || id::VARCHAR AS key FROM {0}", sp.read_parquet(data))
        keys = sorted(f"s{i % 11}-{i}" for i in range(18000))
        bounds = [keys[len(keys) * q // 4] for q in (1, 2, 3)]
        rep = df.repartition(4, range_by="key", bounds=bounds)
        srt = rep.partial_sort("key")
        files = sp._part_files(srt.compute())
        got = [r["key"] for f in files for r in pq.read_table(f).to_pylist()]
        assert got == keys
        # the local executor ran the repartition and the sort as one job
        # (no repartition files), with the files of the two stages
        assert [n.split("-")[1] for n in sp.stages_run] == ["sql", "sort"]
        assert not os.path.exists(sp._dir(rep._node))
    with ffkit.session(data_root=str(tmp_path / "two"), workers=2) as sp2:
        df2 = sp2.partial_sql("SELECT id, s || '-' || id::VARCHAR AS key FROM {0}", sp2.read_parquet(data))
        rep2 = df2.repartition(4, range_by="key", bounds=bounds)
        rep2.compute()
        files2 = sp2._part_files(rep2.partial_sort("key").compute())
        assert [n.split("-")[1] for n in sp2.stages_run] == ["sql", "repartition", "sort"]
        assert [os.path.basename(f) for f in files2] == [os.path.basename(f) for f in files]
        for a, b in zip(files, files2):
            assert pq.read_table(a).equals(pq.read_table(b))
    with ffkit.session(data_root=str(tmp_path / "root"), workers=2) as sp:
        df = sp.partial_sql("SELECT id, s || '-' || id::VARCHAR AS key FROM {0}", sp.read_parquet(data))
        with pytest.raises(ValueError, match="ascending"):
            df.repartition(3, range_by="key", bounds=["b", "a"])
        with pytest.raises(ValueError, match="want 2 bounds"):
            df.repartition(3, range_by="key", bounds=["a"])
