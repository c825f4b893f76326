import gc
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import ffkit
from ffkit import errors

from conftest import sample_bytes


def epoch(loader):
    out = []
    for b in loader:
        for i, s in zip(b.indices.tolist(), b.samples):
            assert s.tobytes() == sample_bytes(i)
        out.append(b.indices.tolist())
    return out


def test_epoch_covers_every_sample_once(gen):
    path, n = gen
    L = ffkit.Loader(path, batch_size=64, seed=1)
    assert len(L) == -(-n // 64)
    batches = epoch(L)
    flat = [i for b in batches for i in b]
    assert len(batches) == len(L)
    assert sorted(flat) == list(range(n))
    assert flat != list(range(n))  # shuffled
    # Same seed, same order; next epoch, new order.
    assert epoch(ffkit.Loader(path, batch_size=64, seed=1)) == batches
    e1 = epoch(L)
    assert L.epoch == 2
    assert sorted(i for b in e1 for i in b) == list(range(n)) and e1 != batches
    assert epoch(ffkit.Loader(path, batch_size=64, seed=2)) != batches
    seq = epoch(ffkit.Loader(path, batch_size=100, shuffle=False))
    assert [i for b in seq for i in b] == list(range(n))


def test_direct_modes(gen):
    """direct= takes True/False/"on"/"off"/"auto"; every mode delivers the
    same batches, and stats()["direct_choice"] says what was chosen."""
    path, n = gen
    want = epoch(ffkit.Loader(path, batch_size=64, seed=1))
    for direct, prefix in [(False, "buffered (off: "), ("off", "buffered (off: "), (True, "direct (on: "),
                           ("on", "direct (on: "), ("auto", "buffered (auto: "), ("AUTO", "buffered (auto: ")]:
        L = ffkit.Loader(path, batch_size=64, seed=1, direct=direct)
        assert epoch(L) == want, direct
        assert L.stats()["direct_choice"].startswith(prefix), (direct, L.stats()["direct_choice"])
        L.close()
    with pytest.raises(errors.UsageError, match="direct must be"):
        ffkit.Loader(path, batch_size=64, direct="sometimes")


def test_set_epoch(gen):
    path, n = gen
    a = ffkit.Loader(path, batch_size=50, seed=5)
    epoch(a)
    e1 = epoch(a)
    b = ffkit.Loader(path, batch_size=50, seed=5)
    b.set_epoch(1)
    assert epoch(b) == e1


def test_ranks_partition_an_epoch(gen):
    path, n = gen
    world = 3
    per_rank = [epoch(ffkit.Loader(path, batch_size=128, seed=3, rank=r, world_size=world)) for r in range(world)]
    assert len({len(b) for b in per_rank}) == 1  # equal batch counts: no DDP hang
    flat = [i for r in per_rank for b in r for i in b]
    assert set(flat) == set(range(n))
    dl = [epoch(ffkit.Loader(path, batch_size=128, seed=3, rank=r, world_size=world, drop_last=True)) for r in range(world)]
    assert all(len(b) == n // (world * 128) for b in dl)


def test_rank_defaults_from_environment(gen):
    path, n = gen
    code = f"""
import ffkit
L = ffkit.Loader({path!r}, batch_size=10)
print(L.rank, L.world_size)
"""
    env = dict(os.environ, RANK="1", WORLD_SIZE="4")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "4"]


def test_resume_mid_epoch(gen):
    path, n = gen
    a = ffkit.Loader(path, batch_size=64, seed=9)
    it = iter(a)
    first = [next(it).indices.tolist() for _ in range(10)]
    state = a.state_dict()
    rest = [b.indices.tolist() for b in it]
    assert state["cursor"] == 640 and state["epoch"] == 0
    b = ffkit.Loader(path, batch_size=64, seed=9)
    b.load_state_dict(state)
    assert [x.indices.tolist() for x in b] == rest
    # Elastic: resumed with two ranks, the rest of the epoch is split between them.
    parts = []
    for r in range(2):
        c = ffkit.Loader(path, batch_size=32, seed=9, rank=r, world_size=2)
        c.load_state_dict(state)
        parts += [i for x in c for i in x.indices.tolist()]
    assert set(parts) == {i for x in rest for i in x}
    # A state for other data is refused.
    other = dict(state, dataset={"sources": [{"samples": 1, "files": [], "hash": "00"}]})
    with pytest.raises(errors.UsageError):
        ffkit.Loader(path, batch_size=64, seed=9).load_state_dict(other)
    with pytest.raises(errors.UsageError):
        ffkit.Loader(path, batch_size=64, seed=10).load_state_dict(state)


def test_batches_are_views_of_shared_memory(gen):
    path, n = gen
    L = ffkit.Loader(path, batch_size=16, seed=0)
    b = next(iter(L))
    s0 = b[0]
    assert not s0.flags.owndata
    assert np.shares_memory(s0, b.data)
    # Writing through the batch's buffer shows in the sample view: same memory.
    start = int(b.positions[0, 0])
    b.data[start] ^= 0xFF
    assert s0[0] == (sample_bytes(int(b.indices[0]))[0] ^ 0xFF)


def test_release_and_hold(gen):
    path, n = gen
    L = ffkit.Loader(path, batch_size=16, seed=0, prefetch=1, hold=2)
    it = iter(L)
    b = next(it)
    kept = b[0].copy()
    b.release()
    with pytest.raises(ValueError):
        b[0]
    # Views keep their batch alive; holding more than the ring allows raises
    # instead of hanging.
    views = []
    with pytest.raises(errors.UsageError):
        for _ in range(10):
            views.append(next(it)[0])
    for v in views:
        assert len(v) > 0
    views.clear()
    gc.collect()
    # Once released (last view dropped) the loader goes on (a new iterator:
    # the exception ended the old one, as for any generator).
    x = next(iter(L))
    assert x[0].tobytes() == sample_bytes(int(x.indices[0]))
    assert kept.tobytes() == sample_bytes(0) or len(kept) > 0


def test_many_epochs_do_not_leak_slots(gen):
    path, n = gen
    L = ffkit.Loader(path, batch_size=500, seed=0, prefetch=2, hold=1)
    for _ in range(4):
        assert sum(len(b) for b in L) == n


def _child_epoch(L, q):
    try:
        q.put(sorted(i for b in L for i in b.indices.tolist()))
    except BaseException as e:
        q.put(repr(e))


def test_loader_in_forked_child(gen):
    import multiprocessing as mp

    path, n = gen
    L = ffkit.Loader(path, batch_size=100, seed=0)
    it = iter(L)
    next(it)  # the parent's engine is in use
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_epoch, args=(L, q))
    p.start()
    got = q.get(timeout=60)
    p.join(timeout=30)
    # The child continued from the parent's position in its own helper.
    assert isinstance(got, list) and len(got) == n - 100
    assert sum(1 for _ in it) == len(L) - 1


def test_pickled_loader_resumes(gen):
    path, n = gen
    L = ffkit.Loader(path, batch_size=100, seed=4)
    it = iter(L)
    next(it)
    rest = [b.indices.tolist() for b in it]
    L2 = ffkit.Loader(path, batch_size=100, seed=4)
    it2 = iter(L2)
    next(it2)
    L3 = pickle.loads(pickle.dumps(L2))
    assert [b.indices.tolist() for b in L3] == rest


def test_bad_data_raises_with_the_go_message(gen, tmp_path):
    path, n = gen
    bad = tmp_path / "bad.ffr"
    data = bytearray(open(path, "rb").read())
    data[-10] ^= 0xFF  # inside the last sample
    bad.write_bytes(bytes(data))
    L = ffkit.Loader(str(bad), batch_size=n, shuffle=False)
    with pytest.raises(errors.ChecksumError) as e:
        list(L)
    assert "bad.ffr" in str(e.value) and f"sample {n - 1}" in str(e.value)
    L = ffkit.Loader(str(bad), batch_size=n, shuffle=False, skip_bad=True)
    assert sum(len(b) for b in L) == n
    with pytest.raises(errors.UsageError):
        ffkit.Loader(path, batch_size=0)


def _indices_through_interrupts(L):
    """The batches' indices of one epoch, iterating again after each
    KeyboardInterrupt as a training loop that survives Ctrl-C would."""
    got = []
    while True:
        try:
            for b in L:
                got.append(b.indices.tolist())
            return got
        except KeyboardInterrupt:
            continue


def test_interrupted_wait_loses_no_batch(gen, monkeypatch):
    """Ctrl-C while waiting for a batch: the stream is dropped, and the next
    iteration continues exactly where the last handed-out batch left off."""
    from ffkit import _engine

    path, n = gen
    ref = [b.indices.tolist() for b in ffkit.Loader(path, batch_size=100, seed=6)]
    L = ffkit.Loader(path, batch_size=100, seed=6)
    real = _engine.Pipe.recv
    calls = {"n": 0}

    def flaky(self):
        calls["n"] += 1
        if calls["n"] in (4, 9, 10):
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(_engine.Pipe, "recv", flaky)
    got = _indices_through_interrupts(L)
    assert got == ref
    assert calls["n"] > 10


def test_stream_request_read_after_the_rewind_is_refused(gen, monkeypatch):
    """The race behind an interrupted wait, made certain: the engine reads a
    stream request only after the rewind that abandoned it (the request sat
    in its socket). That stale stream must not take a batch from the
    rewound position: it is refused, and every batch arrives exactly once."""
    import socket

    from ffkit import _engine

    path, n = gen
    ref = [b.indices.tolist() for b in ffkit.Loader(path, batch_size=100, seed=6)]
    L = ffkit.Loader(path, batch_size=100, seed=6)
    real_send, real_recv, real_call = _engine.Pipe.send, _engine.Pipe.recv, _engine.Engine.call
    st = {"streams": 0, "recvs": 0, "sock": None, "header": None, "late": None}

    def send(self, header, body=b""):
        if header.get("op") == "loader_stream":
            st["streams"] += 1
            if st["streams"] == 2:
                # Hold the second stream's request back, on a duplicate of
                # its socket that outlives the loader's close.
                st["sock"] = socket.socket(fileno=os.dup(self.sock.fileno()))
                st["header"] = header
                return
        return real_send(self, header, body)

    def recv(self):
        st["recvs"] += 1
        if st["recvs"] == 2 or (st["sock"] is not None and st["late"] is None):
            raise KeyboardInterrupt
        return real_recv(self)

    def call(self, header, body=b"", fds=()):
        rep = real_call(self, header, body, fds)
        if header.get("op") in ("loader_restore", "loader_set_epoch") and st["sock"] is not None \
                and st["late"] is None:
            # The engine reads the abandoned stream's request only now,
            # after the rewind.
            _engine.send_request(st["sock"], st["header"])
            st["sock"].settimeout(30)
            st["late"] = st["sock"].recv(1 << 16)
        return rep

    monkeypatch.setattr(_engine.Pipe, "send", send)
    monkeypatch.setattr(_engine.Pipe, "recv", recv)
    monkeypatch.setattr(_engine.Engine, "call", call)
    got = _indices_through_interrupts(L)
    st["sock"].close()
    assert b"reclaimed" in st["late"], st["late"][:200]
    assert got == ref


def test_batches_dying_in_a_forked_child_do_not_free_the_parents_slots(gen):
    path, n = gen
    L = ffkit.Loader(path, batch_size=100, seed=2, prefetch=1, hold=1, ahead=0)
    it = iter(L)
    b = next(it)
    want = [s.tobytes() for s in b.samples]
    pid = os.fork()
    if pid == 0:  # child: its copy of the batch dies and is released
        try:
            b.release()
            gc.collect()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    # The parent keeps reading (past every slot of the ring); its batch must
    # not have been overwritten.
    for _ in range(4 * L._slots):
        x = next(it)
        x.release()
    assert [s.tobytes() for s in b.samples] == want


_WAKE_SCRIPT = r"""
import sys, time
import ffkit
L = ffkit.Loader(sys.argv[1], batch_size=16, seed=3, prefetch=1, hold=1, ahead=0)
it = iter(L)
held = [next(it) for _ in range(L._slots)]  # every slot handed out
deadline = time.monotonic() + 30
while not L._board[L._waiting]:  # the engine now sleeps, waiting for a slot
    assert time.monotonic() < deadline, "the engine never waited for a slot"
    time.sleep(0.001)
# Releasing, oldest first, up to the lend number the engine names wakes it:
# batches arrive with no next() call (which would also wake it).
import select
sock = L._sock.sock
while held and not select.select([sock], [], [], 0.05)[0]:
    held.pop(0).release()
assert select.select([sock], [], [], 30)[0], "the releases never woke the engine"
assert held, "the engine woke only once every batch was back"
held += [next(it) for _ in range(L._slots - len(held))]
# Holding every slot, release one and ask for the next: the stream is empty,
# so the Loader wakes the engine itself.
for _ in range(3 * L._slots):
    held.pop(0).release()
    held.append(next(it))
print("ok")
"""


def test_a_release_wakes_the_sleeping_engine(gen):
    # The helper's sleep for a slot is made an hour long, so only Python's
    # futex wake-ups (not the sleep's safety timeout) can bring the next
    # batches: this fails by timing out if they are broken.
    import subprocess
    import sys

    path, n = gen
    env = dict(os.environ, FFKIT_ENGINE_WAKE_TIMEOUT="1h")
    out = subprocess.run([sys.executable, "-c", _WAKE_SCRIPT, str(path)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok")


def test_equal_length_samples_are_rows_of_one_view(tmp_path):
    # Equal-length samples take the 2-D-view path of Batch.samples; they must
    # be the same 1-D views as slicing would give, and survive as views.
    from ffkit.ffrecord import FileWriter

    path = str(tmp_path / "eq.ffr")
    data = [bytes([i % 251]) * 48 + i.to_bytes(4, "little") for i in range(300)]
    with FileWriter(path, len(data)) as w:
        for d in data:
            w.write_one(d)
    L = ffkit.Loader(path, batch_size=64, seed=5)
    seen = []
    for b in L:
        assert b._grid == 52  # the engine saw equal lengths on a grid
        s = b.samples
        assert len(s) == len(b)
        for i, x in zip(b.indices.tolist(), s):
            assert x.ndim == 1 and x.dtype == np.uint8 and x.shape == (52,)
            assert x.tobytes() == data[i]
            assert np.shares_memory(x, b.data)
        seen += b.indices.tolist()
        b.release()
    assert sorted(seen) == list(range(300))
    L.close()
