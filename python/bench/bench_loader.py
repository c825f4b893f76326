"""Throughput of ffkit's Python front end against same-run baselines.

Measures, on one generated dataset (fixed-size samples, page cache warm):

  go-loader      the Go loader itself: the bundled `ffkit load --json`
  ffkit.Loader   the Python Loader (numpy views of the engine's shared ring)
  ffkit.torch    ffkit.torch.Dataset through DataLoader(batch_size=None,
                 num_workers=0): uint8 tensors viewing the ring
  pytorch-files  the usual PyTorch recipe: a map-style Dataset reading one
                 file per sample, DataLoader(num_workers=2, shuffle=True)
  hfai-read      HFAiLab-style: FileReader.read(batch_indices) per batch in
                 a loop (ffkit.ffrecord, the drop-in)
  hfai-torch     HFAiLab-style ffrecord.torch Dataset + DataLoader with
                 num_workers=2 (one batched read per batch in each worker)

and prints samples/s and each figure's ratio to the Python Loader, plus the
engine's cost per batch (a request round trip with no I/O).

    python3 python/bench/bench_loader.py [--samples 32768] [--size 4096]
        [--batch-size 256] [--epochs 3] [--json]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np


def make_data(d, n, size):
    from ffkit.ffrecord import FileWriter

    ffr = os.path.join(d, "data.ffr")
    files = os.path.join(d, "files")
    os.makedirs(files)
    rng = np.random.default_rng(0)
    with FileWriter(ffr, n) as w:
        for i in range(n):
            b = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
            w.write_one(b)
            with open(os.path.join(files, f"{i:08d}.bin"), "wb") as f:
                f.write(b)
    return ffr, files


def warm(path):
    # Read everything once so every contender starts from a warm page cache.
    if os.path.isdir(path):
        for name in os.listdir(path):
            with open(os.path.join(path, name), "rb") as f:
                f.read()
    else:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def go_loader(ffr, bs, epochs):
    from ffkit import _engine

    out = subprocess.run([_engine.binary_path(), "load", ffr, "--batch-size", str(bs), "--shuffle", "--seed", "1",
                          "--epochs", str(epochs), "--json"], check=True, capture_output=True, text=True).stdout
    s = json.loads(out)
    return s["delivered_samples"] / s["elapsed_s"]


def py_loader(ffr, bs, epochs):
    import ffkit

    t = time.perf_counter()
    L = ffkit.Loader(ffr, bs, shuffle=True, seed=1)
    n = 0
    for _ in range(epochs):
        for b in L:
            s = b.samples  # one numpy view per sample
            n += len(s)
    dt = time.perf_counter() - t
    L.close()
    return n / dt


def ffkit_torch(ffr, bs, epochs):
    import torch.utils.data as tud

    import ffkit.torch as ft

    t = time.perf_counter()
    ds = ft.Dataset(ffr, bs, shuffle=True, seed=1)
    dl = tud.DataLoader(ds, batch_size=None, num_workers=0)
    n = 0
    for e in range(epochs):
        ds.set_epoch(e)
        for b in dl:
            n += len(b["samples"])
    return n / (time.perf_counter() - t)


class FilesDataset:
    def __init__(self, d):
        self.files = sorted(os.path.join(d, f) for f in os.listdir(d))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        import torch

        with open(self.files[i], "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)


def pytorch_files(files, bs, epochs, workers):
    import torch.utils.data as tud

    t = time.perf_counter()
    dl = tud.DataLoader(FilesDataset(files), batch_size=bs, shuffle=True, num_workers=workers)
    n = 0
    for _ in range(epochs):
        for b in dl:
            n += b.shape[0]
    return n / (time.perf_counter() - t)


def hfai_read(ffr, bs, epochs):
    from ffkit.ffrecord import FileReader

    t = time.perf_counter()
    r = FileReader(ffr)
    n = 0
    rng = np.random.default_rng(1)
    for _ in range(epochs):
        perm = rng.permutation(r.n)
        for i in range(0, r.n, bs):
            n += len(r.read(perm[i : i + bs]))
    return n / (time.perf_counter() - t)


def hfai_torch(ffr, bs, epochs, workers):
    import torch

    import ffkit.ffrecord.torch as fft

    class DS(fft.Dataset):
        def process(self, indices, data):
            return [torch.from_numpy(d) for d in data]

    t = time.perf_counter()
    dl = fft.DataLoader(DS(ffr), batch_size=bs, shuffle=True, num_workers=workers)
    n = 0
    for _ in range(epochs):
        for b in dl:
            n += b.shape[0]
    return n / (time.perf_counter() - t)


def roundtrip_us(k=2000):
    from ffkit import _engine

    e = _engine.get()
    e.call({"op": "hello"})
    t = time.perf_counter()
    for _ in range(k):
        e.call({"op": "hello"})
    return (time.perf_counter() - t) / k * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=32768)
    ap.add_argument("--size", type=int, default=4096, help="bytes per sample")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers of the PyTorch baselines")
    ap.add_argument("--rounds", type=int, default=2, help="alternate the contenders this many times, keep the best")
    ap.add_argument("--dir", default=None, help="where to write the data (default: a temp dir, removed after)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False

    d = a.dir or tempfile.mkdtemp(prefix="ffkit-bench-")
    try:
        ffr, files = make_data(d, a.samples, a.size)
        warm(ffr)
        warm(files)
        runs = {
            "go-loader": lambda: go_loader(ffr, a.batch_size, a.epochs),
            "ffkit.Loader": lambda: py_loader(ffr, a.batch_size, a.epochs),
            "hfai-read": lambda: hfai_read(ffr, a.batch_size, a.epochs),
        }
        if have_torch:
            runs["ffkit.torch"] = lambda: ffkit_torch(ffr, a.batch_size, a.epochs)
            runs["pytorch-files"] = lambda: pytorch_files(files, a.batch_size, a.epochs, a.workers)
            runs["hfai-torch"] = lambda: hfai_torch(ffr, a.batch_size, a.epochs, a.workers)
        best = {}
        for _ in range(a.rounds):
            for name, fn in runs.items():
                best[name] = max(best.get(name, 0.0), fn())
        rt = roundtrip_us()
    finally:
        if a.dir is None:
            shutil.rmtree(d, ignore_errors=True)

    py = best["ffkit.Loader"]
    result = {
        "samples": a.samples, "sample_bytes": a.size, "batch_size": a.batch_size, "epochs": a.epochs,
        "samples_per_s": best,
        "ratios": {
            "ffkit.Loader / go-loader": py / best["go-loader"],
            "ffkit.Loader / hfai-read": py / best["hfai-read"],
        },
        "engine_roundtrip_us": rt,
        "engine_roundtrip_us_per_batch_share": rt / (a.batch_size * 1e6 / py) if py else None,
    }
    if have_torch:
        result["ratios"]["ffkit.Loader / pytorch-files"] = py / best["pytorch-files"]
        result["ratios"]["ffkit.torch / pytorch-files"] = best["ffkit.torch"] / best["pytorch-files"]
        result["ratios"]["ffkit.Loader / hfai-torch"] = py / best["hfai-torch"]
    if a.json:
        print(json.dumps(result, indent=2))
        return
    print(f"dataset: {a.samples} samples x {a.size} B, batch {a.batch_size}, {a.epochs} epochs, page cache warm, "
          f"best of {a.rounds} rounds")
    for name, v in best.items():
        print(f"  {name:14s} {v:12.0f} samples/s  {v * a.size / 2**20:9.1f} MiB/s  ({v / py:.2f}x ffkit.Loader)")
    for k, v in result["ratios"].items():
        print(f"  {k:32s} {v:.2f}")
    per_batch = a.batch_size / py * 1e6
    print(f"  engine request round trip: {rt:.0f} us (a batch takes {per_batch:.0f} us at the Loader's rate)")


if __name__ == "__main__":
    sys.exit(main())
