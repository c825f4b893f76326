"""PyTorch DataLoader workers against the in-process loader, same run.

Measures, on one generated dataset of equal-length samples (page cache warm,
CRCs checked), samples/s of:

  loader          ffkit.Loader in this process, each batch turned into
                  tensors by ffkit.torch.to_tensors (the baseline: what
                  num_workers=0 costs)
  ffkit.torch.DataLoader(num_workers=W), default transform
                  reads in the main process; to_tensors (views only) runs
                  there too, so no worker starts
  ffkit.torch.DataLoader+transform
                  the same with a user transform (here one that calls
                  to_tensors) run in W workers: batches go to the workers as
                  slot numbers and come back as views of the main process's
                  ring (the worker path's own cost)
  ffkit.torch.DataLoader+transform+fresh
                  the same with the worker pool off (FFKIT_TORCH_POOL=0):
                  this DataLoader forks its workers, as the first one in a
                  process does; with the pool, later DataLoaders with the
                  same transform reuse the idle workers of earlier ones
  torch+Dataset   torch.utils.data.DataLoader(ffkit.torch.Dataset,
                  batch_size=None, num_workers=W): each worker a loader of
                  its own, batches moved by PyTorch (the old path)
  hfai-torch      the HFAiLab ffrecord.torch pattern (ffkit.ffrecord.torch,
                  the drop-in: a Dataset with process(indices, data) and its
                  DataLoader, W workers, each reading whole batches)

Every DataLoader keeps its workers across epochs (persistent_workers=True),
so worker start-up is paid once per run, not per epoch. Contenders alternate
within each round; the ratios are medians of the per-round ratios (the
machine is shared).

    python3 python/bench/bench_torch.py [--samples 32768] [--size 4096]
        [--batch-size 256] [--epochs 3] [--workers 2] [--rounds 5] [--only A,B] [--json]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np


def make_data(d, n, size):
    from ffkit.ffrecord import FileWriter

    ffr = os.path.join(d, "data.ffr")
    rng = np.random.default_rng(0)
    with FileWriter(ffr, n) as w:
        for _ in range(n):
            w.write_one(rng.integers(0, 256, size, dtype=np.uint8))
    with open(ffr, "rb") as f:  # warm the page cache
        while f.read(1 << 24):
            pass
    return ffr


def count(b):
    s = b["samples"]
    return s.shape[0] if hasattr(s, "shape") else len(s)


def run_loader(ffr, bs, epochs, workers):
    import ffkit
    import ffkit.torch as ft

    t = time.perf_counter()
    n = 0
    with ffkit.Loader(ffr, bs, shuffle=True, seed=1) as L:
        for _ in range(epochs):
            for b in L:
                n += count(ft.to_tensors(b))
    return n / (time.perf_counter() - t)


def run_ffkit_dataloader(ffr, bs, epochs, workers):
    import ffkit.torch as ft

    t = time.perf_counter()
    n = 0
    with ft.DataLoader(ffr, bs, num_workers=workers, seed=1, persistent_workers=True) as dl:
        for _ in range(epochs):
            for b in dl:
                n += count(b)
    return n / (time.perf_counter() - t)


def user_transform(batch):
    import ffkit.torch as ft

    return ft.to_tensors(batch)


def run_ffkit_dataloader_transform(ffr, bs, epochs, workers):
    import ffkit.torch as ft

    t = time.perf_counter()
    n = 0
    with ft.DataLoader(ffr, bs, num_workers=workers, seed=1, persistent_workers=True,
                       transform=user_transform) as dl:
        for _ in range(epochs):
            for b in dl:
                n += count(b)
    return n / (time.perf_counter() - t)


def run_ffkit_dataloader_transform_fresh(ffr, bs, epochs, workers):
    """The same as run_ffkit_dataloader_transform with the worker pool off:
    the DataLoader forks its workers (what every DataLoader paid before the
    pool, and what the first one of a process still pays)."""
    import ffkit.torch as ft

    was, ft._POOL_ON = ft._POOL_ON, False
    try:
        return run_ffkit_dataloader_transform(ffr, bs, epochs, workers)
    finally:
        ft._POOL_ON = was


def run_torch_dataset(ffr, bs, epochs, workers):
    import torch.utils.data as tud

    import ffkit.torch as ft

    t = time.perf_counter()
    n = 0
    ds = ft.Dataset(ffr, bs, seed=1)
    dl = tud.DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)
    for _ in range(epochs):
        for b in dl:
            n += count(b)
    dt = time.perf_counter() - t
    del dl
    return n / dt


def run_hfai_torch(ffr, bs, epochs, workers):
    import torch

    import ffkit.ffrecord.torch as fft

    class DS(fft.Dataset):
        def process(self, indices, data):
            return [torch.from_numpy(d) for d in data]

    t = time.perf_counter()
    n = 0
    dl = fft.DataLoader(DS(ffr), batch_size=bs, shuffle=True, num_workers=workers,
                        persistent_workers=workers > 0)
    for _ in range(epochs):
        for b in dl:
            n += b.shape[0]
    dt = time.perf_counter() - t
    del dl
    return n / dt


RUNS = {
    "loader": run_loader,
    "ffkit.torch.DataLoader": run_ffkit_dataloader,
    "ffkit.torch.DataLoader+transform": run_ffkit_dataloader_transform,
    "ffkit.torch.DataLoader+transform+fresh": run_ffkit_dataloader_transform_fresh,
    "torch+Dataset": run_torch_dataset,
    "hfai-torch": run_hfai_torch,
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=32768)
    ap.add_argument("--size", type=int, default=4096, help="bytes per sample")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write the data (default: a temp dir, removed after)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", default=None, help="comma-separated contenders to run (default: all)")
    a = ap.parse_args()

    d = a.dir or tempfile.mkdtemp(prefix="ffkit-bench-torch-")
    try:
        ffr = make_data(d, a.samples, a.size)
        if a.only:
            for k in set(RUNS) - set(a.only.split(",")):
                del RUNS[k]
        rounds = []
        load0 = os.getloadavg()[0]
        for r in range(a.rounds):
            # Alternate the order between rounds so no contender always runs
            # first (or right after the heaviest).
            names = list(RUNS) if r % 2 == 0 else list(RUNS)[::-1]
            got = {}
            for name in names:
                got[name] = RUNS[name](ffr, a.batch_size, a.epochs, a.workers)
            rounds.append(got)
            if not a.json:
                print(f"round {r}: " + ", ".join(f"{k} {v:.0f}" for k, v in got.items()), flush=True)
        load = os.getloadavg()[0]
    finally:
        if a.dir is None:
            shutil.rmtree(d, ignore_errors=True)

    def paired(num, den):
        if num not in RUNS or den not in RUNS:
            return None
        return statistics.median(x[num] / x[den] for x in rounds)

    dl = "ffkit.torch.DataLoader"
    result = {
        "samples": a.samples, "sample_bytes": a.size, "batch_size": a.batch_size, "epochs": a.epochs,
        "workers": a.workers, "load_average": load, "load_average_start": load0,
        "samples_per_s_median": {k: statistics.median(x[k] for x in rounds) for k in RUNS},
        "rounds": rounds,
        "ratios": {
            f"{dl} / loader": paired(dl, "loader"),
            f"{dl} / hfai-torch": paired(dl, "hfai-torch"),
            f"{dl} / torch+Dataset": paired(dl, "torch+Dataset"),
            f"{dl}+transform / loader": paired(dl + "+transform", "loader"),
            f"{dl}+transform / hfai-torch": paired(dl + "+transform", "hfai-torch"),
            f"{dl}+transform+fresh / loader": paired(dl + "+transform+fresh", "loader"),
            f"{dl}+transform+fresh / hfai-torch": paired(dl + "+transform+fresh", "hfai-torch"),
            "torch+Dataset / loader": paired("torch+Dataset", "loader"),
        },
    }
    if a.json:
        print(json.dumps(result, indent=2))
        return
    print(f"dataset: {a.samples} samples x {a.size} B, batch {a.batch_size}, {a.epochs} epochs, {a.workers} workers, "
          f"page cache warm, {a.rounds} rounds, load average {load:.1f} on {os.cpu_count()} CPUs "
          f"(at the start {load0:.1f})")
    print("samples/s, median of rounds:")
    for k, v in result["samples_per_s_median"].items():
        print(f"  {k:34s} {v:12.0f}  {v * a.size / 2**20:9.1f} MiB/s")
    print("ratios: median over rounds of the ratio within each round")
    for k, v in result["ratios"].items():
        if v is not None:
            print(f"  {k:50s} {v:.2f}")


if __name__ == "__main__":
    sys.exit(main())
