"""PyTorch integration: ``ffkit.torch.Dataset``, an IterableDataset over
``ffkit.Loader`` that shards across DataLoader workers and ranks.

Use it with ``torch.utils.data.DataLoader(ds, batch_size=None, num_workers=k)``
(the dataset yields whole batches). With ``num_workers=0`` the tensors are
``torch.from_numpy`` views of the engine's shared memory: no copy. With
workers, PyTorch itself moves each batch to the main process (its one copy).

Sharding: worker w of k on rank r of W reads as rank ``r*k + w`` of ``W*k``,
so every sample of an epoch is read exactly once across all workers and
ranks, every worker gets the same number of batches, and with one rank the
DataLoader's round-robin over workers delivers the global order.

Epochs: call ``ds.set_epoch(e)`` before iterating (as with
DistributedSampler) unless the workers are persistent, in which case each
new iteration continues with the next epoch by itself. ``state_dict`` /
``load_state_dict`` make the dataset Stateful for torchdata's
StatefulDataLoader.
"""
import os

import numpy as np
import torch
import torch.utils.data

from .loader import Loader, _dist_defaults

__all__ = ["Dataset", "to_tensors"]


def to_tensors(batch):
    """The default conversion: {"indices": int64 tensor, "samples": ...}, all
    views of the batch's shared memory (no copy).

    When every sample has the same length L (and none repeats another's
    bytes), "samples" is one (n, L) uint8 tensor whose rows are the samples
    in the order they lie in memory, and "indices" follows that order: one
    tensor instead of n is much cheaper, and in a DataLoader worker PyTorch
    moves it to the main process in one piece. Otherwise "samples" is a list
    of 1-D uint8 tensors in delivery order (views of one tensor).
    """
    pos = batch.positions
    n = len(pos)
    if n == 0:
        return {"indices": torch.from_numpy(batch.indices), "samples": []}
    lens = pos[:, 1] - pos[:, 0]
    L = int(lens[0])
    if L > 0 and (lens == L).all():
        order = np.argsort(pos[:, 0], kind="stable")
        starts = pos[order, 0]
        first = int(starts[0])
        if (starts == first + L * np.arange(n)).all():
            rows = batch.data[first : first + n * L].reshape(n, L)
            return {"indices": torch.from_numpy(batch.indices[order]), "samples": torch.from_numpy(rows)}
    lo, hi = int(pos[:, 0].min()), int(pos[:, 1].max())
    span = torch.from_numpy(batch.data[lo:hi])
    rel = (pos - lo).tolist()
    return {
        "indices": torch.from_numpy(batch.indices),
        "samples": [span[s:e] for s, e in rel],
    }


class Dataset(torch.utils.data.IterableDataset):
    """Batches of an FFRecord dataset for a torch DataLoader (batch_size=None).

    Args:
        path, batch_size, shuffle, seed, drop_last, **loader_options: as
            ``ffkit.Loader``.
        rank, world_size: default from torch.distributed or RANK/WORLD_SIZE.
        transform: called with each ``ffkit.loader.Batch``; its result is
            what the DataLoader yields (default ``to_tensors``). It may decode
            samples; the batch is released once it returns unless the result
            views the batch's memory (views keep it alive).
    """

    def __init__(self, path, batch_size, shuffle=True, seed=0, rank=None, world_size=None, drop_last=False,
                 transform=None, **loader_options):
        super().__init__()
        self.path = path
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.rank, self.world_size = _dist_defaults(rank, world_size)
        self.drop_last = drop_last
        self.transform = transform or to_tensors
        self.loader_options = loader_options
        self._epoch = 0
        self._state = None  # to restore on the next loader created
        self._loader = None
        self._key = None

    def _shard(self):
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.rank * nw + wid, self.world_size * nw

    def _get_loader(self):
        rank, world = self._shard()
        key = (os.getpid(), rank, world)
        if self._loader is None or self._key != key:
            self._loader = Loader(self.path, self.batch_size, shuffle=self.shuffle, seed=self.seed, rank=rank,
                                  world_size=world, drop_last=self.drop_last, **self.loader_options)
            self._key = key
            if self._state is not None:
                self._loader.load_state_dict(self._state)
                self._state = None
            elif self._epoch:
                self._loader.set_epoch(self._epoch)
        return self._loader

    def __iter__(self):
        loader = self._get_loader()
        if self._state is not None:
            loader.load_state_dict(self._state)
            self._state = None
        for b in loader:
            out = self.transform(b)
            yield out
        self._epoch = loader.epoch

    def __len__(self):
        """Batches per epoch on this rank (all its DataLoader workers together)."""
        from .ffrecord import FileReader

        if self._loader is not None:
            n = self._loader.n
        else:
            with FileReader(self.path, check_data=False) as r:
                n = r.n
        if self.drop_last:
            return n // (self.world_size * self.batch_size)
        return -(-(-(-n // self.world_size)) // self.batch_size)

    def set_epoch(self, epoch):
        self._epoch = int(epoch)
        self._state = None
        if self._loader is not None:
            self._loader.set_epoch(epoch)

    def state_dict(self):
        if self._loader is not None:
            return {"loader": self._loader.state_dict(), "epoch": self._loader.epoch}
        return {"loader": self._state, "epoch": self._epoch}

    def load_state_dict(self, state):
        self._state = state.get("loader")
        self._epoch = state.get("epoch", 0)
        if self._loader is not None and self._state is not None:
            self._loader.load_state_dict(self._state)
            self._state = None

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_loader"] = None
        d["_key"] = None
        return d
