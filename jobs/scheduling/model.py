"""What the placement policy reads and what it answers: hosts, queued jobs, placements, the decision.

Plain frozen values, so that the policy is a pure function that tests and trace replays call without
processes, SQL or Redis. Bad values raise ``ValueError`` at construction: the API validates specs
before they get here, so one reaching the policy is a bug upstream, not a user's typo.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

Device = Literal["gpu", "cpu"]
# ``nproc_per_node: "gpu"``: every GPU of one host, as torchrun's own ``--nproc-per-node gpu``.
WHOLE_HOST = "gpu"
DEFAULT_PRIORITY = 50


@dataclass(frozen=True)
class Host:
    """One worker's host.

    ``gpus`` are the physical indices it owns. ``free_gpus`` are the ones it offers (None: all of
    them); a GPU the host reports as taken outside torchyard, or drained, is left out of it.
    ``cpu_slots_used`` counts slots taken outside torchyard. The running placements handed to the
    policy are taken off on top of both, so a host's own report never needs to know about them.
    """

    id: str
    gpus: tuple[int, ...] = ()
    free_gpus: tuple[int, ...] | None = None
    cpu_slots: int = 0
    cpu_slots_used: int = 0
    alive: bool = True

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("a host needs an id")
        if len(set(self.gpus)) != len(self.gpus) or any(i < 0 for i in self.gpus):
            raise ValueError(f"host {self.id}: GPU indices must be distinct and non-negative, got {self.gpus}")
        if self.free_gpus is not None and not set(self.free_gpus) <= set(self.gpus):
            raise ValueError(f"host {self.id}: free GPUs {self.free_gpus} are not all among its GPUs {self.gpus}")
        if self.cpu_slots < 0 or self.cpu_slots_used < 0:
            raise ValueError(f"host {self.id}: cpu slots must be non-negative")

    def offered_gpus(self) -> tuple[int, ...]:
        return self.gpus if self.free_gpus is None else self.free_gpus


@dataclass(frozen=True)
class QueuedJob:
    """A queued job as the policy sees it: what it asks for and where it stands in line.

    It asks ``nnodes`` distinct hosts with ``nproc_per_node`` GPUs each (CPU slots when ``device`` is
    cpu); ``nproc_per_node == "gpu"`` asks every GPU of each host. ``submitted_seq`` orders equal
    priorities (earlier first); it is the submission order, not a clock.
    """

    id: str
    owner: str
    nnodes: int = 1
    nproc_per_node: int | Literal["gpu"] = 1
    device: Device = "gpu"
    submitted_seq: int = 0
    priority: int = DEFAULT_PRIORITY

    def __post_init__(self) -> None:
        if self.device not in ("gpu", "cpu"):
            raise ValueError(f"job {self.id}: device must be gpu or cpu, got {self.device!r}")
        if isinstance(self.nnodes, bool) or not isinstance(self.nnodes, int) or self.nnodes < 1:
            raise ValueError(f"job {self.id}: nnodes must be an integer >= 1, got {self.nnodes!r}")
        if self.nproc_per_node == WHOLE_HOST:
            if self.device != "gpu":
                raise ValueError(f"job {self.id}: nproc_per_node 'gpu' needs device gpu")
        elif isinstance(self.nproc_per_node, bool) or not isinstance(self.nproc_per_node, int) or self.nproc_per_node < 1:
            raise ValueError(f"job {self.id}: nproc_per_node must be an integer >= 1 or 'gpu', got {self.nproc_per_node!r}")

    @property
    def whole_host(self) -> bool:
        return self.nproc_per_node == WHOLE_HOST


@dataclass(frozen=True)
class NodePlacement:
    """One node of a job: the host it runs on and what it holds there (GPU indices, or CPU slots)."""

    node_rank: int
    host: str
    gpus: tuple[int, ...] = ()
    cpu_slots: int = 0


@dataclass(frozen=True)
class Placement:
    """Where a job runs: one node per host, node rank 0 first (it hosts torchrun's rendezvous)."""

    job_id: str
    nodes: tuple[NodePlacement, ...]


class Waiting(NamedTuple):
    """A queued job left waiting: its 1-based place among the waiting jobs, and what holds it."""

    position: int
    reason: str


@dataclass(frozen=True)
class Decision:
    """One pass: the jobs to start now, and every other queued job with its position and reason.

    ``waiting`` iterates in the order the next pass will consider the jobs.
    """

    placements: tuple[Placement, ...] = ()
    waiting: dict[str, Waiting] = field(default_factory=dict)
