"""Who goes first among equal priorities, and who runs on borrowed quota.

Each owner's use is the GPUs and CPU slots its running placements hold plus those placed earlier in
the same pass. Measured against its share (its quota where one is set, else an equal part of the
live hosts among the owners with jobs), the owner with the smallest dominant share goes first, then
submission order. An owner with a quota that places beyond it runs on borrowed GPUs (Kueue's model:
idle capacity is lent, and taken back by preemption when its owner needs it).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from itertools import groupby

from jobs.scheduling.model import Placement, QueuedJob, Quota


class Usage:
    def __init__(self, quotas: Mapping[str, Quota], owners: set[str], gpu_total: int, cpu_total: int, running: Iterable[Placement]):
        self.quotas = quotas
        self.ratios: dict[str, float] = {}
        self.version = 0  # bumped by every change of use
        self.gpus: Counter[str] = Counter()
        self.cpu: Counter[str] = Counter()
        for p in running:
            self.add(p.owner, p.gpu_count, p.cpu_count)
        n = max(1, len(owners))
        self.equal = (gpu_total / n, cpu_total / n)

    def add(self, owner: str, gpus: int, cpu: int) -> None:
        self.gpus[owner] += gpus
        self.cpu[owner] += cpu
        self.ratios.pop(owner, None)
        self.version += 1

    def ratio(self, owner: str) -> float:
        """The owner's dominant share: the larger of GPUs and CPU slots used over its share of each."""
        r = self.ratios.get(owner)
        if r is None:
            r = self.ratios[owner] = self._ratio(owner)
        return r

    def _ratio(self, owner: str) -> float:
        quota = self.quotas.get(owner)
        gpu_share = quota.gpus if quota is not None and quota.gpus is not None else self.equal[0]
        cpu_share = quota.cpu_slots if quota is not None and quota.cpu_slots is not None else self.equal[1]
        return max(_over(self.gpus[owner], gpu_share), _over(self.cpu[owner], cpu_share))

    def borrows(self, owner: str, gpus: int, cpu: int) -> bool:
        """Whether placing this much more for ``owner`` goes beyond its quota."""
        quota = self.quotas.get(owner)
        if quota is None:
            return False
        return (quota.gpus is not None and self.gpus[owner] + gpus > quota.gpus) or (
            quota.cpu_slots is not None and self.cpu[owner] + cpu > quota.cpu_slots)

    def within_gpu_quota(self, owner: str, gpus: int) -> bool:
        """Whether ``owner`` has a GPU quota that this many more GPUs still fit: it may reclaim."""
        quota = self.quotas.get(owner)
        return quota is not None and quota.gpus is not None and self.gpus[owner] + gpus <= quota.gpus


def _over(used: float, share: float) -> float:
    if share > 0:
        return used / share
    return math.inf if used else 0.0


def fair_order(jobs: list[QueuedJob], usage: Usage) -> Iterator[QueuedJob]:
    """``jobs`` (sorted by priority, then submission order) in the order a pass considers them.

    Within a priority level the next job is the head of the owner with the lowest ``ratio`` (then the
    earliest submitted head); the owner's ratio is read again after a job is yielded if the caller
    changed the use in between (it placed the job).
    """
    ratio = usage.ratio
    for _, level in groupby(jobs, key=lambda j: j.priority):
        lists: dict[str, list[QueuedJob]] = {}
        for job in level:
            lists.setdefault(job.owner, []).append(job)
        if len(lists) == 1:
            yield from next(iter(lists.values()))
            continue
        heap = [(ratio(o), js[0].submitted_seq, js[0].id, o, 0) for o, js in lists.items()]
        heapq.heapify(heap)
        while heap:
            _, _, _, owner, i = heapq.heappop(heap)
            js = lists[owner]
            # The same owner goes on while it stays ahead of the best other head: no heap work for the
            # long runs of jobs that do not change its use.
            other = heap[0][:3] if heap else None
            r, seen = ratio(owner), usage.version
            while True:
                yield js[i]
                i += 1
                if i == len(js):
                    break
                if other is not None:
                    if usage.version != seen:
                        r, seen = ratio(owner), usage.version
                    if r < other[0]:
                        continue
                    key = (r, js[i].submitted_seq, js[i].id)
                    if key > other:
                        heapq.heappush(heap, (*key, owner, i))
                        break
