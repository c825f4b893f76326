"""ffkit.torch.DataLoader: reads in the main process, transforms in worker
processes; the batches and their order do not depend on the worker count."""
import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ffkit  # noqa: E402
import ffkit.torch as ft  # noqa: E402
from ffkit import errors  # noqa: E402
from ffkit.ffrecord import FileReader, FileWriter  # noqa: E402

from conftest import sample_bytes  # noqa: E402


def views(batch):
    """to_tensors, run in the workers (to_tensors itself runs in the main
    process)."""
    return ft.to_tensors(batch)


def indices(dl):
    return [b["indices"].tolist() for b in dl]


def check(b):
    for i, s in zip(b["indices"].tolist(), b["samples"]):
        assert bytes(s.numpy()) == sample_bytes(i)


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """Equal-length samples: the default transform gives one (n, L) tensor."""
    p = tmp_path_factory.mktemp("fixed") / "fixed.ffr"
    n, size = 1500, 96
    with FileWriter(p, n) as w:
        for i in range(n):
            w.write_one(np.full(size, i % 251, np.uint8))
    return str(p), n


def test_same_batches_in_same_order_for_any_worker_count(gen):
    path, n = gen
    with ffkit.Loader(path, 100, seed=5) as L:
        want = [b.indices.tolist() for b in L] + [b.indices.tolist() for b in L]  # epochs 0 and 1
    for workers in (0, 1, 2, 4):
        with ft.DataLoader(ft.Dataset(path, 100, seed=5, transform=views), num_workers=workers) as dl:
            got = []
            for epoch in range(2):
                for b in dl:
                    check(b)
                    got.append(b["indices"].tolist())
            assert got == want, f"num_workers={workers}"
            assert len(dl) == -(-n // 100)


def test_resume_with_another_worker_count(gen):
    path, n = gen
    dl = ft.DataLoader(path, 64, num_workers=2, seed=9, transform=views)
    whole = indices(dl)
    assert sorted(i for b in whole for i in b) == list(range(n))
    dl.set_epoch(0)
    it = iter(dl)
    head = [next(it)["indices"].tolist() for _ in range(7)]
    assert head == whole[:7]
    state = dl.state_dict()
    it.close()  # batches were in flight in the workers: they are not lost
    assert indices(dl) == whole[7:]
    for workers in (0, 3):
        with ft.DataLoader(path, 32, num_workers=workers, seed=9, transform=views) as dl2:
            dl2.load_state_dict(state)
            # Another batch size regroups the same stream of samples.
            rest = [i for b in indices(dl2) for i in b]
            assert rest == [i for b in whole[7:] for i in b]
    # A Dataset's state and a DataLoader's are the same thing.
    ds = ft.Dataset(path, 64, seed=9)
    ds.load_state_dict(state)
    dl3 = ft.DataLoader(ds, num_workers=1)  # to_tensors: read and made in this process
    assert indices(dl3) == whole[7:]
    assert not dl3._workers
    dl3.close()
    dl.close()


def _ring_of(dl):
    L = dl._loader
    base = np.frombuffer(L._ring, np.uint8, 1).__array_interface__["data"][0]
    return base, base + len(L._ring)


def test_worker_results_view_the_main_ring_and_keep_their_slot(fixed):
    path, n = fixed
    dl = ft.DataLoader(path, 100, num_workers=2, seed=1, persistent_workers=True, transform=views)
    lo, hi = _ring_of(dl)
    kept = None
    seen = []
    for b in dl:
        s = b["samples"]
        assert isinstance(s, torch.Tensor) and s.shape == (100, 96)
        assert lo <= s.data_ptr() < hi  # a view of this process's ring: no copy
        idx = b["indices"].tolist()
        assert [int(r[0]) for r in s] == [i % 251 for i in idx]
        if kept is None:
            kept = (idx, s)  # held across the epoch: its slot must not be reused
        seen += idx
    assert len(dl._workers) == 2
    assert sorted(seen) == list(range(n))
    idx, s = kept
    assert [int(r[0]) for r in s] == [i % 251 for i in idx]
    assert (s == s[:, :1]).all()
    dl.close()


def test_first_results_do_not_wait_for_a_full_pipeline(fixed):
    """Between chunks the main process yields the results that are back
    before it reads more: the first batch of an epoch does not wait for
    num_workers * prefetch_factor reads."""
    path, n = fixed
    dl = ft.DataLoader(path, 10, num_workers=2, seed=1, transform=views, prefetch_factor=8)
    c = dl._chunk
    assert dl._inflight == 4 * c
    sent = []
    send = dl._send

    def slow_send(w, b, base):
        if len(sent) == c:
            # The second chunk is read only once the first one's results
            # are back (a condition, not a duration).
            deadline = time.monotonic() + 300
            while not dl._ready(0):
                assert time.monotonic() < deadline, "the first chunk's results never came"
                time.sleep(0.005)
        sent.append(w)
        return send(w, b, base)

    dl._send = slow_send
    it = iter(dl)
    first = next(it)
    assert len(sent) == 2 * c  # the whole pipeline (4 chunks) before
    assert first["samples"].shape == (10, 96)
    del dl._send
    assert sum(len(b["indices"]) for b in it) == n - 10
    dl.close()


def _structured(batch):
    """A result of the shapes the workers send without the pickler (dicts,
    lists, tuples of tensors and scalars), with ring views of several
    dtypes and strides, tensors made in the worker, and one object that is
    not covered (a numpy array) deep inside."""
    t = torch.from_numpy(batch.data)
    ends = batch.positions
    first = t[int(ends[0, 0]) : int(ends[0, 1])]
    even = t[: (len(t) // 8) * 8]
    return {
        "first": first,  # a uint8 ring view
        "wide": even.view(torch.int64)[:4],  # an int64 ring view
        "strided": even[:16].view(2, 8).t(),  # a transposed ring view
        "scalar": t[int(ends[0, 0])],  # a 0-dim ring view
        "made": (torch.tensor(batch.indices, dtype=torch.float32) / 2, torch.tensor(True), torch.zeros(0)),
        "list": [torch.arange(3, dtype=torch.int16), 7, 1.5, "s", b"b", None, False],
        "deep": {"a": [{"b": np.arange(3)}]},  # falls back to the pickler
        "step": batch.step,
    }


def _same(a, b):
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert (a == b).all()
    else:
        assert a == b


def test_structured_results_come_back_as_made(gen, fixed):
    """Results the workers encode without the pickler come back equal to
    the transform's own result in this process (types, dtypes, shapes,
    strides, values); ring views stay views of this process's ring; the
    fast encoding covers the common results and refuses what it cannot
    carry."""
    for path, _ in (gen, fixed):
        with ffkit.Loader(path, 64, seed=3) as L:
            want = []
            for b in L:
                w = _structured(b)
                # Copies of the views, made so that they keep their strides.
                want.append({**w, **{k: torch.empty_strided(w[k].shape, w[k].stride(), dtype=w[k].dtype).copy_(w[k])
                                     for k in ("first", "wide", "strided", "scalar")}})
                del w
                b.release()
        with ft.DataLoader(path, 64, num_workers=2, seed=3, transform=_structured) as dl:
            lo, hi = _ring_of(dl)
            got = 0
            for w, b in zip(want, dl):
                _same(b, w)
                for k in ("first", "wide", "strided", "scalar"):
                    assert lo <= b[k].data_ptr() < hi, k
                got += 1
            assert got == len(want) == len(dl)

    t = torch.arange(10, dtype=torch.uint8)
    lo = t.data_ptr()
    node = ft._fast_encode({"x": t[2:], "y": [t[::2]], "z": (3, "a")}, lo, lo + 10)
    assert node[0] == ft._DICT and node[2][0] == (ft._RING, 2, (8,), (1,), ft._DTYPE_CODE[torch.uint8])
    for slow in (np.arange(3), memoryview(b"x"), {1: t}, [[[[[t]]]]], t.float().requires_grad_(),
                 torch.zeros(1 << 19, dtype=torch.int32), t.to(torch.complex64), [t, t], (t[1:], [t[1:]] * 2)):
        with pytest.raises(ft._Slow):
            ft._fast_encode(slow, lo, lo + 10)


def _transform(batch):
    info = ft.get_worker_info()
    data = batch.data
    first = batch.positions[0]
    return {
        "pid": os.getpid(),
        "worker": info.id if info is not None else -1,
        "torch_worker": torch.utils.data.get_worker_info().id,
        "indices": torch.from_numpy(batch.indices),  # small: by value
        "first": batch[0],  # a numpy view of the ring
        "first_mv": memoryview(data[first[0] : first[1]]),  # a memoryview of the ring
        "sums": torch.tensor([int(s.sum()) for s in batch]),  # made in the worker
        "big": torch.full((300_000, 4), len(batch), dtype=torch.int32),  # > 1 MiB: torch shared memory
        "step": batch.step,
    }


def test_transform_runs_in_the_workers(gen):
    path, n = gen
    with ft.DataLoader(path, 50, num_workers=3, seed=2, transform=_transform) as dl:
        workers = set()
        for k, b in enumerate(dl):
            assert b["pid"] != os.getpid()
            # Batch k went to worker (k // c) mod 3: chunks of c = prefetch_factor // 2 batches.
            assert b["worker"] == b["torch_worker"] == (k // dl._chunk) % 3
            workers.add(b["pid"])
            idx = b["indices"].tolist()
            assert b["step"] == k
            assert bytes(b["first"]) == sample_bytes(idx[0])
            assert bytes(b["first_mv"]) == sample_bytes(idx[0])
            assert b["sums"].tolist() == [sum(sample_bytes(i)) for i in idx]
            assert b["big"].shape == (300_000, 4) and int(b["big"][-1, -1]) == len(idx)
        assert len(workers) == 3


def _fails_at_step_3(batch):
    if batch.step == 3 and not os.path.exists(os.environ["DATALOADER_TEST_FLAG"]):
        raise ValueError("bad sample in step 3")
    return batch.indices.tolist()


def test_transform_error_is_raised_and_iteration_resumes(gen, tmp_path, monkeypatch):
    path, n = gen
    flag = tmp_path / "flag"
    monkeypatch.setenv("DATALOADER_TEST_FLAG", str(flag))
    with ffkit.Loader(path, 100, seed=4) as L:
        want = [b.indices.tolist() for b in L]
    with ft.DataLoader(path, 100, num_workers=2, seed=4, transform=_fails_at_step_3,
                       persistent_workers=True) as dl:
        got = []
        with pytest.raises(ValueError, match="bad sample in step 3"):
            for b in dl:
                got.append(b)
        assert got == want[:3]
        flag.touch()
        assert list(dl) == want[3:]  # the failed batch again, then the rest


def _dies_at_step_2(batch):
    if batch.step == 2 and not os.path.exists(os.environ["DATALOADER_TEST_FLAG"]):
        os._exit(7)
    return batch.indices.tolist()


def test_worker_death_is_an_error_and_new_workers_continue(gen, tmp_path, monkeypatch):
    path, n = gen
    flag = tmp_path / "flag"
    monkeypatch.setenv("DATALOADER_TEST_FLAG", str(flag))
    with ffkit.Loader(path, 200, seed=6) as L:
        want = [b.indices.tolist() for b in L]
    for pf in (4, None):
        flag.unlink(missing_ok=True)
        with ft.DataLoader(path, 200, num_workers=2, seed=6, transform=_dies_at_step_2, prefetch_factor=pf) as dl:
            got = []
            with pytest.raises(errors.EngineError, match="exit code 7"):
                for b in dl:
                    got.append(b)
            if pf == 4:
                assert got == want[:2]  # chunks of 2: batches 0 and 1 came from the other worker
            else:
                # A longer chunk: the results the worker made before it died
                # in it (batches 0 and 1) died with it; they come again.
                assert got == want[: len(got)] and len(got) <= 2
            flag.touch()
            assert list(dl) == want[len(got):]


def test_forked_workers_use_their_own_engine(gen):
    """A transform that itself reads through ffkit in a forked worker gets a
    helper of its own; the main process's stream goes on undisturbed."""
    path, n = gen

    reader = FileReader(path)
    reader.read_one(0)  # the main process's engine exists before the fork

    def transform(batch):
        i = int(batch.indices[0])
        return bytes(reader.read_one(i)) == bytes(batch[0]), os.getpid()

    with ft.DataLoader(path, 300, num_workers=2, seed=3, transform=transform,
                       multiprocessing_context="fork") as dl:
        out = list(dl)
    assert all(ok for ok, _ in out)
    assert len({pid for _, pid in out}) == 2
    assert bytes(reader.read_one(5)) == sample_bytes(5)
    reader.close()


@pytest.mark.skipif(not os.environ.get("FFKIT_TEST_SPAWN"), reason="set FFKIT_TEST_SPAWN=1 (a spawned worker "
                    "imports torch afresh: slow on a loaded machine)")
def test_spawned_worker_maps_the_ring(fixed):
    path, n = fixed
    with ft.DataLoader(path, 500, num_workers=1, seed=0, multiprocessing_context="spawn", transform=views) as dl:
        lo, hi = _ring_of(dl)
        seen = []
        for b in dl:
            assert lo <= b["samples"].data_ptr() < hi
            seen += b["indices"].tolist()
    assert sorted(seen) == list(range(n))


def _fails_at_last_step(batch):
    if batch.step == 14 and not os.path.exists(os.environ["DATALOADER_TEST_FLAG"]):
        raise ValueError("bad last batch")
    return batch.indices.tolist()


def test_error_in_the_last_batch_is_not_skipped(gen, tmp_path, monkeypatch):
    path, n = gen
    flag = tmp_path / "flag"
    monkeypatch.setenv("DATALOADER_TEST_FLAG", str(flag))
    with ffkit.Loader(path, 200, seed=8) as L:
        want = [b.indices.tolist() for b in L]
    assert len(want) == 15
    with ft.DataLoader(path, 200, num_workers=2, seed=8, transform=_fails_at_last_step) as dl:
        got = []
        with pytest.raises(ValueError, match="bad last batch"):
            for b in dl:
                got.append(b)
        assert got == want[:14]
        flag.touch()
        assert list(dl) == want[14:]


def _whoami(batch):
    return os.getpid(), ft.get_worker_info().seed, batch.indices.tolist()


def test_idle_workers_serve_the_next_dataloader(gen, monkeypatch):
    """A closed DataLoader's workers go to a pool: the next DataLoader (or
    the next epoch without persistent_workers) with the same transform uses
    them, reseeded, instead of forking; a transform that cannot be pickled
    (a closure) gets workers of its own; idle workers exit by themselves."""
    path, n = gen
    with ffkit.Loader(path, 100, seed=7) as L:
        want = [[b.indices.tolist() for b in L] for _ in range(2)]  # epochs 0 and 1

    def run(transform, epochs=1):
        with ft.DataLoader(path, 100, num_workers=2, seed=7, transform=transform) as dl:
            out = [list(dl) for _ in range(epochs)]
        assert [[idx for _, _, idx in e] for e in out] == want[:epochs]
        return [{(pid, seed) for pid, seed, _ in e} for e in out]

    first, second = run(_whoami, epochs=2)  # not persistent: the epochs share the pool
    assert len(first) == 2 and {p for p, _ in second} == {p for p, _ in first}
    assert {s for _, s in second}.isdisjoint({s for _, s in first})  # reseeded
    (third,) = run(_whoami)
    assert {p for p, _ in third} == {p for p, _ in first}

    def closure(batch):
        return _whoami(batch)

    (own,) = run(closure)
    assert {p for p, _ in own}.isdisjoint({p for p, _ in first})

    # Idle workers exit by themselves after ft._IDLE_S; the next DataLoader
    # then forks new ones.
    monkeypatch.setattr(ft, "_IDLE_S", 0.2)
    # The pooled sets must be past the reuse bound (_IDLE_S / 2) first: on a
    # quiet machine the closure's run ends within 0.1 s of the pooling.
    with ft._pool_lock:
        newest = max((since for sets in ft._pool.values() for since, _ in sets), default=0.0)
    while time.monotonic() - newest < ft._IDLE_S:
        time.sleep(0.01)
    (fresh,) = run(_whoami)  # workers forked after the change, so they see it
    assert {p for p, _ in fresh}.isdisjoint({p for p, _ in first})
    pooled = [ws for sets in ft._pool.values() for _, ws in sets for p, *_ in ws
              if p.pid in {q for q, _ in fresh}]
    assert pooled
    for p, *_ in pooled[0]:
        p.join(timeout=120)  # waits for the exit, not for a duration
        assert p.exitcode == 0
    (last,) = run(_whoami)
    assert {p for p, _ in last}.isdisjoint({p for p, _ in fresh})
