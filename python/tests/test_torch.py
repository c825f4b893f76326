import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

import ffkit.torch as ft  # noqa: E402
from ffkit.ffrecord import FileReader  # noqa: E402

from conftest import sample_bytes  # noqa: E402


def check_batch(b):
    idx = b["indices"].tolist()
    for i, s in zip(idx, b["samples"]):
        assert s.dtype == torch.uint8
        assert bytes(s.numpy()) == sample_bytes(i)
    return idx


@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_dataset_covers_epoch_once(gen, workers):
    path, n = gen
    ds = ft.Dataset(path, 100, seed=1)
    seen = []
    for b in DataLoader(ds, batch_size=None, num_workers=workers):
        seen += check_batch(b)
    assert sorted(seen) == list(range(n))


def test_workers_and_ranks_shard_without_overlap(gen):
    path, n = gen
    seen = []
    counts = []
    for rank in range(2):
        ds = ft.Dataset(path, 64, seed=2, rank=rank, world_size=2)
        batches = [check_batch(b) for b in DataLoader(ds, batch_size=None, num_workers=2)]
        counts.append(len(batches))
        seen += [i for b in batches for i in b]
    assert counts[0] == counts[1]
    assert set(seen) == set(range(n))
    assert len(seen) - n < 2 * 2 * 64  # only rank-balancing padding repeats


def test_tensors_are_views_without_copy(gen):
    path, n = gen
    ds = ft.Dataset(path, 32, seed=0)
    loader = ds._get_loader()
    b = next(iter(loader))
    out = ft.to_tensors(b)
    s = out["samples"][0]
    # The tensor's memory is the batch's shared memory.
    start = int(b.positions[0, 0])
    assert s.data_ptr() == b.data[start:].__array_interface__["data"][0]


def test_set_epoch_changes_order(gen):
    path, n = gen
    ds = ft.Dataset(path, 500, seed=3)
    e0 = [check_batch(b) for b in DataLoader(ds, batch_size=None)]
    ds.set_epoch(1)
    e1 = [check_batch(b) for b in DataLoader(ds, batch_size=None, num_workers=2)]
    assert sorted(i for b in e1 for i in b) == list(range(n))
    assert e0 != e1


def test_stateful_dataloader_resume(gen):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    path, n = gen
    ds = ft.Dataset(path, 100, seed=7)
    dl = sdl.StatefulDataLoader(ds, batch_size=None, num_workers=0)
    it = iter(dl)
    for _ in range(5):
        next(it)
    state = dl.state_dict()
    rest = [b["indices"].tolist() for b in it]
    ds2 = ft.Dataset(path, 100, seed=7)
    dl2 = sdl.StatefulDataLoader(ds2, batch_size=None, num_workers=0)
    dl2.load_state_dict(state)
    assert [b["indices"].tolist() for b in dl2] == rest


def test_stateful_dataloader_resume_with_workers(gen):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    path, n = gen
    ds = ft.Dataset(path, 100, seed=7)
    dl = sdl.StatefulDataLoader(ds, batch_size=None, num_workers=2)
    it = iter(dl)
    first = [next(it)["indices"].tolist() for _ in range(6)]
    state = dl.state_dict()
    rest = [b["indices"].tolist() for b in it]
    del it
    ds2 = ft.Dataset(path, 100, seed=7)
    dl2 = sdl.StatefulDataLoader(ds2, batch_size=None, num_workers=2)
    dl2.load_state_dict(state)
    resumed = [b["indices"].tolist() for b in dl2]
    assert resumed == rest
    assert sorted(i for b in first + resumed for i in b) == list(range(n))


# --- ffkit.ffrecord.torch: the reference's batch-fetching Dataset ---------

import ffkit.ffrecord.torch as fft  # noqa: E402


class Decoded(fft.Dataset):
    def process(self, indices, data):
        return [torch.tensor([i, len(d), int(d[0])]) for i, d in zip(indices, data)]


@pytest.mark.parametrize("workers", [0, 2])
def test_ffrecord_torch_dataloader(gen, workers):
    path, n = gen
    ds = Decoded(path)
    ds.reader.read([0, 1])  # the parent reads before the workers fork
    dl = fft.DataLoader(ds, batch_size=64, shuffle=True, num_workers=workers)
    rows = torch.cat(list(dl)).tolist()
    assert sorted(r[0] for r in rows) == list(range(n))
    for i, ln, first in rows[::50]:
        assert ln == len(sample_bytes(i)) and first == sample_bytes(i)[0]
    assert len(dl) == -(-n // 64)


def test_ffrecord_torch_set_step(gen):
    path, n = gen
    dl = fft.DataLoader(Decoded(path), batch_size=64, shuffle=False, num_workers=2)
    whole = len(dl)
    dl.set_step(40)
    assert len(dl) == whole - 40
    rows = torch.cat(list(dl)).tolist()
    assert [r[0] for r in rows] == list(range(40 * 64, n))
    # As the reference: the step holds for every iteration until changed.
    assert [r[0] for r in torch.cat(list(dl)).tolist()] == list(range(40 * 64, n))
    dl.set_step(0)
    assert len(dl) == whole
    assert len(torch.cat(list(dl))) == n
    with pytest.raises(ValueError, match="out of range"):
        dl.set_step(whole + 1)
    with pytest.raises(ValueError, match="out of range"):
        dl.set_step(-1)


class Counting(fft.Dataset):
    """Counts the batches process() sees (in this process: num_workers=0)."""

    def __init__(self, path):
        super().__init__(path)
        self.seen = 0

    def process(self, indices, data):
        self.seen += 1
        return [torch.tensor([i]) for i in indices]


def test_ffrecord_torch_set_step_not_skippable_reads_and_drops(gen):
    path, n = gen
    ds = Counting(path)
    dl = fft.DataLoader(ds, batch_size=100, num_workers=0, skippable=False)
    dl.set_step(3)
    assert len(dl) == -(-n // 100) - 3
    got = torch.cat(list(dl)).flatten().tolist()
    assert got == list(range(300, n))
    assert ds.seen == -(-n // 100)  # the 3 skipped batches were read too
    ds.seen = 0
    dl.set_step(2, skippable=True)
    assert torch.cat(list(dl)).flatten().tolist() == list(range(200, n))
    assert ds.seen == -(-n // 100) - 2


def test_ffrecord_dataset_add_is_ffrecord_concat(gen):
    path, n = gen
    a, b = Decoded(path), Decoded(path)
    c = a + b
    assert isinstance(c, fft.ConcatDataset)
    got = [t.tolist()[0] for t in c[[1, n, n + 2, 0]]]
    assert got == [1, 0, 2, 0]


def test_reader_registry_lists_nested_readers(gen):
    path, n = gen

    class Inner(fft.ReaderRegistry):
        def __init__(self):
            self.r1 = FileReader(path)
            self.r2 = FileReader(path)

    class Outer(fft.Dataset):
        def __init__(self):
            self.reader = FileReader(path)
            self.inner = Inner()
            self.alias = self.reader  # the same reader once

    rs = Outer().ffreaders()
    assert len(rs) == 3 and all(isinstance(r, FileReader) for r in rs)


def test_subset_and_concat(gen):
    path, n = gen
    a, b = Decoded(path), Decoded(path)
    c = fft.ConcatDataset([fft.Subset(a, [5, 6, 7]), b])
    assert len(c) == 3 + n
    got = [t.tolist()[0] for t in c[[0, 2, 3, 4]]]
    assert got == [5, 7, 0, 1]


def test_plain_torch_dataset_with_reader_in_workers(gen):
    """A map-style torch Dataset holding a FileReader (the common HFAiLab
    pattern) in forked workers, after the parent used it."""
    path, n = gen

    class PerSample(torch.utils.data.Dataset):
        def __init__(self):
            self.r = FileReader(path)

        def __len__(self):
            return 200

        def __getitem__(self, i):
            return torch.from_numpy(self.r.read_one(i)[:4].copy())

    ds = PerSample()
    ds.r.read_one(0)
    out = torch.cat(list(DataLoader(ds, batch_size=50, num_workers=2, multiprocessing_context="fork")))
    assert out.shape[0] == 200
    assert bytes(out[3].numpy()) == sample_bytes(3)[:4]


def test_fixed_size_samples_come_as_one_tensor(tmp_path):
    from ffkit.ffrecord import FileWriter

    p = tmp_path / "fixed.ffr"
    with FileWriter(p, 1000) as w:
        for i in range(1000):
            w.write_one(np.full(64, i % 251, np.uint8))
    ds = ft.Dataset(str(p), 100, seed=0)
    seen = []
    for b in DataLoader(ds, batch_size=None, num_workers=0):
        s = b["samples"]
        assert isinstance(s, torch.Tensor) and s.shape == (100, 64)
        idx = b["indices"].tolist()
        assert [int(r[0]) for r in s] == [i % 251 for i in idx]
        seen += idx
    assert sorted(seen) == list(range(1000))


def test_rank_and_world_size_from_torch_distributed(gen):
    import socket
    import subprocess
    import sys

    path, n = gen
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = f"""
import torch, torch.distributed as dist, ffkit
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
L = ffkit.Loader({path!r}, batch_size=10)
print(L.rank, L.world_size)
dist.destroy_process_group()
"""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["RANK"], env["WORLD_SIZE"] = "3", "8"  # torch.distributed wins over the environment
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1"]
