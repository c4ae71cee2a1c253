"""The live hosts' free capacity during one pass: what is left after the running placements, and
what each placement of the pass takes from it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from jobs.scheduling import packing
from jobs.scheduling.model import Host, NodePlacement, Placement, QueuedJob
from jobs.scheduling.pool import Pool


class Need(NamedTuple):
    """What a job asks, the key under which jobs that ask the same are answered alike in one pass."""

    device: str
    nnodes: int
    per_node: int  # 0 for every GPU of a host
    whole: bool

    @classmethod
    def of(cls, job: QueuedJob) -> Need:
        if job.whole_host:
            return cls("gpu", job.nnodes, 0, True)
        return cls(job.device, job.nnodes, int(job.nproc_per_node), False)


class Cluster:
    """Free GPUs (as index lists) and CPU slots of the live hosts, numbered in host id order."""

    def __init__(self, hosts: Iterable[Host], running: Iterable[Placement]):
        hosts = list(hosts)
        if len({h.id for h in hosts}) != len(hosts):
            raise ValueError("host ids must be distinct")
        live = sorted((h for h in hosts if h.alive), key=lambda h: h.id)
        self.ids = [h.id for h in live]
        number = {hid: i for i, hid in enumerate(self.ids)}
        held: list[set[int]] = [set() for _ in live]
        cpu_used = [h.cpu_slots_used for h in live]
        for placement in running:
            for node in placement.nodes:
                h = number.get(node.host)
                if h is None:  # a dead or unknown host: nothing is placed there anyway
                    continue
                held[h].update(node.gpus)
                cpu_used[h] += node.cpu_slots
        self.free_gpus = [sorted(set(h.offered_gpus()) - held[i]) for i, h in enumerate(live)]
        self.gpu = Pool([len(f) for f in self.free_gpus], [len(h.gpus) for h in live])
        self.cpu = Pool([max(0, h.cpu_slots - cpu_used[i]) for i, h in enumerate(live)], [h.cpu_slots for h in live])
        # What the live hosts have at all, busy or not: a job that exceeds it can never run on them.
        self.gpu_inventory = Pool(list(self.gpu.totals), self.gpu.totals)
        self.cpu_inventory = Pool(list(self.cpu.totals), self.cpu.totals)
        self.number = number
        self.offered = [h.offered_gpus() for h in live]

    def pool(self, device: str) -> Pool:
        return self.gpu if device == "gpu" else self.cpu

    def inventory(self, device: str) -> Pool:
        return self.gpu_inventory if device == "gpu" else self.cpu_inventory

    def find(self, need: Need) -> list[int] | None:
        """The hosts ``need`` would get now (best fit), or None when it does not fit."""
        if need.whole:
            return self.gpu.whole_hosts(need.nnodes)
        return self.pool(need.device).best_fit(need.per_node, need.nnodes)

    def claim(self, h: int, gpus: Iterable[int]) -> None:
        """Take these free GPUs of host ``h`` out of the pool (held for a job that is not placed yet)."""
        gone = set(gpus) & set(self.free_gpus[h])
        if gone:
            self.free_gpus[h] = [i for i in self.free_gpus[h] if i not in gone]
            self.gpu.take(h, len(gone))

    def release(self, h: int, gpus: Iterable[int]) -> None:
        """Give claimed GPUs of host ``h`` back to the pool."""
        back = set(gpus) - set(self.free_gpus[h])
        if back:
            self.free_gpus[h] = sorted(set(self.free_gpus[h]) | back)
            self.gpu.give(h, len(back))

    def place(self, job_id: str, need: Need, hosts: list[int], **meta: object) -> Placement:
        nodes = []
        for rank, h in enumerate(hosts):
            if need.device == "cpu":
                self.cpu.take(h, need.per_node)
                nodes.append(NodePlacement(rank, self.ids[h], cpu_slots=need.per_node))
                continue
            free = self.free_gpus[h]
            n = len(free) if need.whole else need.per_node
            gpus = packing.choose(free, n)
            self.free_gpus[h] = [i for i in free if i not in gpus]
            self.gpu.take(h, n)
            nodes.append(NodePlacement(rank, self.ids[h], gpus=gpus))
        return Placement(job_id, tuple(nodes), **meta)  # type: ignore[arg-type]


class Snapshot:
    """Capacity at one moment, for the question "would this have fit then?"."""

    def __init__(self, cluster: Cluster):
        self.gpu = cluster.gpu.copy()
        self.cpu = cluster.cpu.copy()

    def fits(self, need: Need) -> bool:
        if need.whole:
            return len(self.gpu.whole) >= need.nnodes
        pool = self.gpu if need.device == "gpu" else self.cpu
        return pool.count_at_least(need.per_node) >= need.nnodes
