"""Drop-in for ``ffrecord.torch``: a batch-fetching Dataset and a DataLoader
with ``set_step``.

``Dataset.__getitem__`` takes a list of indices, reads them with one batched
read and passes the raw samples to your ``process(indices, data)``.
``DataLoader`` feeds it whole batches of indices (from the usual sampler
options) and applies ``collate_fn`` to what ``process`` returns.
``set_step(k)`` makes every iteration from now on skip its first k batches
(resume; as the reference, until ``set_step(0)``), without reading them
unless ``skippable=False``. Readers work in forked and spawned workers alike.
``ReaderRegistry.ffreaders()`` lists the FileReaders an object holds;
``ds1 + ds2`` of two Datasets is this module's ConcatDataset.
"""
import bisect
import itertools
import operator
from collections import defaultdict

import torch.utils.data as tud
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset as TorchDataset

from . import FileReader

__all__ = ["Dataset", "Subset", "ConcatDataset", "DataLoader", "ReaderRegistry"]


class ReaderRegistry:
    """Mixin: ``ffreaders()`` lists every FileReader the object holds in its
    attributes, and those of every ReaderRegistry it holds, recursively (as
    the reference's registry; each reader once, however often referenced)."""

    def ffreaders(self):
        out, seen = [], set()

        def walk(obj):
            if id(obj) in seen:
                return
            seen.add(id(obj))
            for v in vars(obj).values():
                if isinstance(v, FileReader):
                    if id(v) not in seen:
                        seen.add(id(v))
                        out.append(v)
                elif isinstance(v, ReaderRegistry):
                    walk(v)

        walk(self)
        return out


class Dataset(TorchDataset, ReaderRegistry):
    """Reads a batch of samples per ``__getitem__(indices)`` and hands them to
    ``process``; subclass it and define ``process``. ``ds1 + ds2`` is a
    ConcatDataset of this module (which takes lists of indices)."""

    def __init__(self, fnames, check_data=True):
        self.fnames = fnames
        self.reader = FileReader(fnames, check_data)

    def __len__(self):
        return self.reader.n

    def __getitem__(self, indices):
        if not isinstance(indices, (list, tuple)):
            raise TypeError("indices must be a list of index")
        data = self.reader.read(indices)
        return self.process(indices, data)

    def process(self, indices, data):
        """Turns raw samples (1-D uint8 arrays) into samples; the returned
        list is passed to the DataLoader's collate_fn."""
        raise NotImplementedError

    def __add__(self, other):
        return ConcatDataset([self, other])


class Subset(Dataset):
    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, indices):
        return self.dataset[[self.indices[i] for i in indices]]

    def __len__(self):
        return len(self.indices)


class ConcatDataset(Dataset):
    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("datasets should not be an empty iterable")
        for d in self.datasets:
            if not isinstance(d, Dataset):
                raise TypeError(f"ConcatDataset takes ffrecord Datasets, not {type(d).__name__}")
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self):
        return self.cumulative_sizes[-1]

    def _convert_index(self, idx):
        if idx < 0:
            if -idx > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            idx += len(self)
        d = bisect.bisect_right(self.cumulative_sizes, idx)
        return d, idx - (self.cumulative_sizes[d - 1] if d else 0)

    def __getitem__(self, indices):
        groups = defaultdict(list)
        where = defaultdict(list)
        for pos, idx in enumerate(indices):
            d, s = self._convert_index(idx)
            groups[d].append(s)
            where[d].append(pos)
        out = [None] * len(indices)
        for d, sub in groups.items():
            for pos, item in zip(where[d], self.datasets[d][sub]):
                out[pos] = item
        return out


class _SkippingBatchSampler(tud.Sampler):
    """Batches of indices from a sampler, without the first `skip` batches of
    every iteration (the sampler still draws them, so a random sampler's
    generator advances exactly as without the skip)."""

    def __init__(self, batch_sampler):
        self.batch_sampler = batch_sampler
        self.skip = 0

    def __iter__(self):
        yield from itertools.islice(iter(self.batch_sampler), self.skip, None)

    def __len__(self):
        return max(len(self.batch_sampler) - self.skip, 0)


class DataLoader(TorchDataLoader):
    """torch DataLoader that fetches whole batches from an ffrecord Dataset
    (one batched read per batch) and supports ``set_step``. Plain torch
    datasets work as with torch's DataLoader."""

    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None,
                 persistent_workers=False, skippable=True, **kwargs):
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        self._ffr = isinstance(dataset, Dataset)
        if self._ffr:
            if batch_sampler is None:
                if sampler is None:
                    sampler = tud.RandomSampler(dataset, generator=generator) if shuffle else tud.SequentialSampler(dataset)
                batch_sampler = tud.BatchSampler(sampler, batch_size, drop_last)
            skipping = _SkippingBatchSampler(batch_sampler)
            super().__init__(dataset, batch_size=None, sampler=skipping, num_workers=num_workers,
                             collate_fn=collate_fn or tud.default_collate, pin_memory=pin_memory, timeout=timeout,
                             worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
                             generator=generator, prefetch_factor=prefetch_factor,
                             persistent_workers=persistent_workers, **kwargs)
            self._skipping = skipping
            self._discard = 0  # batches to read and drop (skippable=False)
            self.skippable = bool(skippable)
        else:
            super().__init__(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                             batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn,
                             pin_memory=pin_memory, drop_last=drop_last, timeout=timeout,
                             worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
                             generator=generator, prefetch_factor=prefetch_factor,
                             persistent_workers=persistent_workers, **kwargs)
            self._skipping = None

    def set_step(self, step, skippable=None):
        """Makes every iteration from now on start at batch ``step`` (resume),
        until the next ``set_step`` (``set_step(0)`` restores whole epochs),
        as the reference does; ``len()`` counts the batches left.

        Args:
            step: batches to skip, 0 <= step <= len() of a whole epoch.
            skippable: True (default, or as given to the constructor): the
                skipped batches are never read. False: they are read and
                dropped, for a ``process`` with side effects that must see
                every batch.
        """
        if self._skipping is None:
            raise TypeError("set_step needs an ffkit.ffrecord.torch.Dataset")
        if isinstance(step, bool) or not isinstance(step, int):
            try:
                step = operator.index(step)
            except TypeError:
                raise TypeError(f"set_step: step must be an int, not {type(step).__name__}") from None
        whole = len(self._skipping.batch_sampler)
        if not 0 <= step <= whole:
            raise ValueError(f"set_step: step {step} is out of range: an epoch has {whole} batches (0 <= step <= {whole})")
        if skippable is not None:
            self.skippable = bool(skippable)
        if self.skippable:
            self._skipping.skip, self._discard = step, 0
        else:
            self._skipping.skip, self._discard = 0, step

    def __len__(self):
        n = super().__len__()
        if self._skipping is not None:
            n = max(n - self._discard, 0)
        return n

    def __iter__(self):
        it = super().__iter__()
        if self._skipping is None or not self._discard:
            return it
        return self._discarding(it, self._discard)

    @staticmethod
    def _discarding(it, k):
        for _ in range(k):
            if next(it, _END) is _END:
                return
        yield from it


_END = object()
