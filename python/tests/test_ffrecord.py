import hashlib
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest

import ffkit
from ffkit import errors
from ffkit.ffrecord import FileReader, FileWriter, PackedFolder
from ffkit.ffrecord.package import MAGIC_BYTES, pack_folder
from ffkit.ffrecord.utils import dump

from conftest import sample_bytes


def vector_content(name, i):
    if name == "small.ffr":
        return (f"sample-{i}" * (i + 1)).encode()
    if name == "empty-and-odd.ffr":
        n = [0, 1, 4095, 4096, 4097][i]
        return bytes((i * 37 + j) % 251 for j in range(n))
    if name == "multi/PART_00000.ffr":
        return f"file0-sample{i}".encode()
    if name == "multi/PART_00002.ffr":
        return f"file2-sample{i}".encode()
    raise KeyError(name)


def test_shared_vectors_read(vectors):
    d, exp = vectors
    for name, e in exp.items():
        with FileReader(d / name) as r:
            assert r.n == e["n"]
            got = r.read(list(range(r.n)))
            assert [len(g) for g in got] == e["lengths"]
            assert [zlib.crc32(g) for g in got] == e["crc32"]
            for i, g in enumerate(got):
                assert g.dtype == np.uint8 and g.ndim == 1
                assert g.tobytes() == vector_content(name, i)
            if r.n:
                assert r.read_one(r.n - 1).tobytes() == vector_content(name, r.n - 1)


def test_shared_directory_is_one_dataset(vectors):
    d, _ = vectors
    r = FileReader(d / "multi")
    assert r.n == 12
    got = [x.tobytes() for x in r.read(range(12))]
    assert got == [f"file0-sample{i}".encode() for i in range(7)] + [f"file2-sample{i}".encode() for i in range(5)]
    # A list of files and directories concatenates.
    r2 = FileReader([str(d / "small.ffr"), str(d / "multi")])
    assert r2.n == 22
    assert r2.read_one(10).tobytes() == b"file0-sample0"


def test_writer_is_byte_identical_to_reference(vectors, tmp_path):
    d, exp = vectors
    for name, e in exp.items():
        out = tmp_path / name.replace("/", "_")
        with FileWriter(out, e["n"]) as w:
            for i in range(e["n"]):
                w.write_one(vector_content(name, i))
        assert hashlib.sha256(out.read_bytes()).hexdigest() == e["sha256"], name


def test_write_one_stores_a_buffers_bytes(tmp_path):
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    f = np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3))
    p = tmp_path / "buf.ffr"
    with FileWriter(p, 4) as w:
        w.write_one(a)  # the reference stored shape[0] = 3 bytes of it
        w.write_one(memoryview(b"abc"))
        w.write_one(bytearray(b""))
        w.write_one(f)
    r = FileReader(p)
    got = r.read([0, 1, 2, 3])
    assert got[0].tobytes() == a.tobytes() and len(got[0]) == 48
    assert got[1].tobytes() == b"abc"
    assert len(got[2]) == 0
    assert got[3].tobytes() == np.ascontiguousarray(f).tobytes()
    with pytest.raises(TypeError):
        FileWriter(tmp_path / "x.ffr", 1).write_one("text")


def test_empty_file(tmp_path):
    p = tmp_path / "empty.ffr"
    with FileWriter(p, 0):
        pass
    assert p.stat().st_size == 12
    r = FileReader(p)
    assert r.n == 0
    assert r.read([]) == []
    r.validate()
    with pytest.raises(IndexError):
        r.read_one(0)


def test_no_index_limit_and_duplicates(gen):
    path, n = gen
    r = FileReader(path)
    idx = np.random.default_rng(0).integers(0, n, size=10000)
    got = r.read(idx)
    assert len(got) == 10000
    for i, g in zip(idx[::97], got[::97]):
        assert g.tobytes() == sample_bytes(int(i))
    assert got[0].tobytes() == sample_bytes(int(idx[0]))


def test_bad_indices(gen):
    path, n = gen
    r = FileReader(path)
    with pytest.raises(errors.IndexOutOfRange) as e:
        r.read([0, n])
    assert str(n) in str(e.value)
    with pytest.raises(IndexError):
        r.read([-1])
    with pytest.raises(TypeError):
        r.read([0.5])


def test_checksum_error_names_file_and_sample(gen, tmp_path):
    path, n = gen
    bad = tmp_path / "bad.ffr"
    shutil.copy(path, bad)
    r0 = FileReader(path)
    good5 = r0.read_one(5).tobytes()
    # Flip one byte of sample 5.
    hdr = 12 + 12 * n
    off = hdr + sum(len(sample_bytes(i)) for i in range(5)) + 3
    with open(bad, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
    r = FileReader(bad)
    assert r.read_one(4).tobytes() == sample_bytes(4)
    with pytest.raises(errors.ChecksumError) as e:
        r.read([1, 5, 7])
    assert isinstance(e.value, ValueError)
    assert "bad.ffr" in str(e.value) and "sample 5" in str(e.value)
    # Checks off: the damaged bytes come back, full length.
    r2 = FileReader(bad, check_data=False)
    got = r2.read_one(5)
    assert len(got) == len(good5) and got.tobytes() != good5
    # validate names every bad sample, even with check_data=False.
    with pytest.raises(errors.ChecksumError) as e:
        r2.validate()
    assert [b["index"] for b in e.value.bad] == [5]
    r0.validate()


def test_truncated_and_garbage_files(gen, tmp_path):
    path, n = gen
    data = open(path, "rb").read()
    cut = tmp_path / "cut.ffr"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(errors.DataError) as e:
        r = FileReader(cut)
        r.read(list(range(n)))
    assert "cut.ffr" in str(e.value)
    garbage = tmp_path / "garbage.ffr"
    garbage.write_bytes(b"\x01\x02\x03\x04\x05")
    for check in (True, False):
        with pytest.raises(errors.DataError):
            FileReader(garbage, check_data=check)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        FileReader(tmp_path / "nope.ffr")
    assert "nope.ffr" in str(e.value)
    assert isinstance(e.value, errors.FFKitError)


def test_writer_leaves_no_file_on_failure(tmp_path):
    p = tmp_path / "short.ffr"
    w = FileWriter(p, 3)
    w.write_one(b"a")
    with pytest.raises(errors.UsageError):
        w.close()
    assert not p.exists()
    with pytest.raises(RuntimeError):
        with FileWriter(p, 1) as w:
            w.write_one(b"x")
            raise RuntimeError("boom")
    assert not p.exists()
    w = FileWriter(p, 1)
    w.write_one(b"x")
    with pytest.raises(errors.UsageError):
        w.write_one(b"y")
    w.close()
    assert FileReader(p).read_one(0).tobytes() == b"x"


def test_pickle_roundtrip(gen):
    path, n = gen
    r = FileReader(path)
    r.read([1])
    r2 = pickle.loads(pickle.dumps(r))
    assert r2.n == n
    assert r2.read_one(42).tobytes() == sample_bytes(42)


def _child_read(reader, q):
    try:
        q.put([x.tobytes() for x in reader.read([0, 10, 2999])])
    except BaseException as e:  # report, do not hang the parent
        q.put(repr(e))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_reader_in_child_after_parent_read(gen, method):
    path, n = gen
    r = FileReader(path)
    parent = r.read([0, 10, 2999])  # the parent has used its engine
    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=_child_read, args=(r, q))
    p.start()
    got = q.get(timeout=60)
    p.join(timeout=30)
    assert got == [x.tobytes() for x in parent]
    # The parent's reader still works, and its arrays are intact.
    assert parent[1].tobytes() == sample_bytes(10)
    assert r.read_one(7).tobytes() == sample_bytes(7)


def test_arrays_survive_fork_and_parent_gc(gen):
    """Arrays a child inherited stay intact when the parent drops its own."""
    path, n = gen
    r = FileReader(path)
    arrs = r.read([3, 4])
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(rfd)
            time.sleep(0.3)  # the parent drops its arrays and reads more meanwhile
            ok = arrs[0].tobytes() == sample_bytes(3) and arrs[1].tobytes() == sample_bytes(4)
            ok = ok and r.read_one(5).tobytes() == sample_bytes(5)
            os.write(wfd, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(wfd)
    del arrs
    for _ in range(20):
        r.read(list(range(100)))
    assert os.read(rfd, 1) == b"1"
    os.waitpid(pid, 0)
    os.close(rfd)


def test_threads_share_a_reader(gen):
    path, n = gen
    r = FileReader(path)
    failures = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(20):
            idx = rng.integers(0, n, size=64)
            for i, g in zip(idx, r.read(idx)):
                if g.tobytes() != sample_bytes(int(i)):
                    failures.append(int(i))

    ts = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert failures == []


def test_ctrl_c_interrupts_a_blocked_read(tmp_path, gen):
    path, n = gen
    fifo = tmp_path / "stuck.ffr"
    os.mkfifo(fifo)
    # Ctrl-C, pressed until it lands: one SIGINT can arrive just before the
    # main thread enters the blocking receive (its handler then runs only
    # after the receive returns, which it never would), so one signal alone
    # makes a test that hangs on a loaded machine. The handler raises
    # KeyboardInterrupt once, as Python's default one does, and ignores the
    # presses after that.
    armed = threading.Event()
    armed.set()

    def on_sigint(signum, frame):
        if armed.is_set():
            armed.clear()
            raise KeyboardInterrupt

    stop = threading.Event()

    def press():
        while not stop.wait(0.2):
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    old = signal.signal(signal.SIGINT, on_sigint)
    presser = threading.Thread(target=press)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            FileReader(fifo)  # the engine blocks opening a FIFO with no writer
    finally:
        stop.set()
        presser.join()
        signal.signal(signal.SIGINT, old)
    # The engine keeps serving other requests.
    assert FileReader(path).read_one(1).tobytes() == sample_bytes(1)
    # Unblock the engine's open so it can finish the abandoned request.
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    os.close(fd)


def test_engine_death_is_survived(gen):
    from ffkit import _engine

    path, n = gen
    r = FileReader(path)
    r.read([0])
    e = _engine.get()
    os.kill(e.proc.pid, signal.SIGKILL)
    e.proc.wait()
    assert r.read_one(9).tobytes() == sample_bytes(9)
    assert _engine.get() is not e


def test_packed_folder(tmp_path):
    src = tmp_path / "src"
    (src / "sub" / "deep").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"alpha")
    (src / "sub" / "b.bin").write_bytes(bytes(range(200)))
    (src / "sub" / "deep" / "c").write_bytes(b"")
    out = tmp_path / "packed.ffr"
    pack_folder(src, out)
    pf = PackedFolder(out)
    assert pf.num_files() == 3
    assert pf.read_one("a.txt").tobytes() == b"alpha"
    assert [x.tobytes() for x in pf.read(["sub/b.bin", "sub/deep/c"])] == [bytes(range(200)), b""]
    assert pf.is_dir("sub") and pf.is_file("sub/b.bin") and not pf.exists("zzz")
    assert sorted(map(str, pf.list(recursive=True))) == ["a.txt", "sub", "sub/b.bin", "sub/deep", "sub/deep/c"]
    with pytest.raises(FileNotFoundError):
        pf.read_one("missing")


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/ffkit-pwned",))


def test_packed_folder_index_cannot_run_code(tmp_path):
    if os.path.exists("/tmp/ffkit-pwned"):
        os.remove("/tmp/ffkit-pwned")
    p = tmp_path / "evil.ffr"
    with FileWriter(p, 2) as w:
        w.write_one(b"payload")
        w.write_one(MAGIC_BYTES + pickle.dumps({"x": _Evil()}))
    with pytest.raises(errors.CorruptError) as e:
        PackedFolder(p)
    assert "posix.system" in str(e.value) or "os.system" in str(e.value)
    assert not os.path.exists("/tmp/ffkit-pwned")


def test_dump(tmp_path):
    items = [sample_bytes(i) for i in range(101)]
    dump(items, tmp_path / "out", nfiles=4)
    files = sorted(os.listdir(tmp_path / "out"))
    assert files == [f"PART_{i:05d}.ffr" for i in range(4)]
    r = FileReader(tmp_path / "out")
    assert [x.tobytes() for x in r.read(range(101))] == items
    dump([{"a": 1}, [2, 3]], tmp_path / "one.ffr", nfiles=1)
    r = FileReader(tmp_path / "one.ffr")
    assert pickle.loads(r.read_one(0).tobytes()) == {"a": 1}


def test_import_ffkit_does_not_import_torch():
    code = "import sys, ffkit, ffkit.ffrecord, ffkit.loader; ffkit.Loader; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_engine_binary_is_bundled():
    from ffkit import _engine

    p = _engine.binary_path()
    assert p.startswith(os.path.dirname(ffkit.__file__))
    assert os.access(p, os.X_OK)


def test_gil_released_while_a_request_waits(tmp_path, gen):
    """A thread blocked in a slow request (the engine opening a FIFO with no
    writer) does not hold up other threads' reads."""
    path, n = gen
    fifo = tmp_path / "slow.ffr"
    os.mkfifo(fifo)
    result = {}

    def slow():
        try:
            FileReader(fifo)
        except Exception as e:  # the FIFO yields no valid header
            result["err"] = e

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.3)
    assert t.is_alive()  # still waiting in the engine
    r = FileReader(path)
    for i in range(50):  # meanwhile this thread reads freely
        assert r.read_one(i).tobytes() == sample_bytes(i)
    assert t.is_alive()
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    os.close(fd)
    t.join(timeout=30)
    assert isinstance(result.get("err"), errors.DataError)
