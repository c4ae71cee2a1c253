"""Per-rank batches in a reproducible global order, resumable at any step.

The order of epoch e is the DistributedSampler permutation seeded with (seed, e). Rank r takes
every world_size-th sample, so the union of all ranks' micro-batches at a step is the same block
of the permutation whatever the world size: 2 ranks x 32 see the samples 1 rank x 64 sees.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from trainer.distributed import RankInfo

Batch = tuple[torch.Tensor, torch.Tensor]


class TrainBatches:
    """Micro-batches of one rank. ``steps_per_epoch`` counts full global batches (the remainder is dropped)."""

    def __init__(self, dataset: Dataset, rank: RankInfo, global_batch: int, grad_accum: int, seed: int, num_workers: int = 0):
        self.dataset = dataset
        self.rank = rank
        self.accum = grad_accum
        self.micro = global_batch // (rank.world_size * grad_accum)
        self.per_rank_step = self.micro * grad_accum
        self.steps_per_epoch = len(dataset) // global_batch
        if self.steps_per_epoch == 0:
            raise ValueError(f"the training set has {len(dataset)} samples, fewer than one global batch of {global_batch}")
        self.seed = seed
        self.num_workers = num_workers
        self.pin = rank.device.type == "cuda"
        self.sampler = DistributedSampler(dataset, num_replicas=rank.world_size, rank=rank.rank, shuffle=True, seed=seed, drop_last=True)

    def _indices(self, epoch: int) -> torch.Tensor:
        self.sampler.set_epoch(epoch)
        idx = torch.tensor(list(self.sampler), dtype=torch.long)
        return idx[: self.steps_per_epoch * self.per_rank_step].view(self.steps_per_epoch, self.accum, self.micro)

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[list[Batch]]:
        """Yield, for each remaining step of the epoch, its ``grad_accum`` micro-batches on the device."""
        idx = self._indices(epoch)[start_step:]
        if hasattr(self.dataset, "get_batch") and self.num_workers == 0:
            for step_idx in idx:
                yield [self._to_device(self.dataset.get_batch(m)) for m in step_idx]
            return
        # Generic map-style datasets (plugins): DataLoader workers collate, same index order.
        loader = DataLoader(self.dataset, batch_sampler=idx.view(-1, self.micro).tolist(),
                            num_workers=self.num_workers, pin_memory=self.pin)
        it = iter(loader)
        for _ in range(len(idx)):
            yield [self._to_device(next(it)) for _ in range(self.accum)]

    def _to_device(self, batch: Batch) -> Batch:
        x, y = batch
        if self.pin:
            # Pinned host memory lets the copy overlap with compute (non_blocking).
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(self.rank.device, non_blocking=True), y.to(self.rank.device, non_blocking=True)


def eval_batches(dataset: Dataset, rank: RankInfo, batch_size: int, max_batches: int | None,
                 ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """This rank's shard of the eval set as (x, y, valid mask).

    Shards are padded to equal length (mask 0 on padding) so every rank runs the same number of
    forward passes: FSDP all-gathers and DDP buffer broadcasts in forward are collectives.
    """
    n = len(dataset)
    per_rank = -(-n // rank.world_size)
    idx = torch.arange(rank.rank, n, rank.world_size)
    valid = torch.ones(per_rank, dtype=torch.bool)
    if len(idx) < per_rank:
        pad = per_rank - len(idx)
        valid[len(idx):] = False
        idx = torch.cat([idx, torch.zeros(pad, dtype=torch.long)])
    batches = -(-per_rank // batch_size)
    if max_batches is not None:
        batches = min(batches, max_batches)
    for b in range(batches):
        sl = slice(b * batch_size, (b + 1) * batch_size)
        if hasattr(dataset, "get_batch"):
            x, y = dataset.get_batch(idx[sl])
        else:
            samples = [dataset[int(i)] for i in idx[sl]]
            x, y = torch.stack([s[0] for s in samples]), torch.stack([torch.as_tensor(s[1]) for s in samples])
        yield x.to(rank.device, non_blocking=True), y.to(rank.device, non_blocking=True), valid[sl].to(rank.device, non_blocking=True)
