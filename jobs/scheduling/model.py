"""What the placement policy reads and what it answers: hosts, queued jobs, placements, the decision.

Plain frozen values, so that the policy is a pure function that tests and trace replays call without
processes, SQL or Redis. Bad values raise ``ValueError`` at construction: the API validates specs
before they get here, so one reaching the policy is a bug upstream, not a user's typo.
"""

from __future__ import annotations

import math
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
    timeout_s: float | None = None
    preemptible: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.priority, bool) or not isinstance(self.priority, int) or not 0 <= self.priority <= 100:
            raise ValueError(f"job {self.id}: priority must be an integer 0-100, got {self.priority!r}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"job {self.id}: timeout_s must be positive, got {self.timeout_s!r}")
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
    """Where a job runs: one node per host, node rank 0 first (it hosts torchrun's rendezvous).

    The rest is what preemption, quotas and backfill read of a running job: ``started_at`` (seconds
    on the caller's clock; None: unknown, so never preempted), ``timeout_s`` (the most it may run;
    None: unknown), and ``borrowed``: it was placed beyond its owner's quota, so an owner within
    its own quota may take its GPUs back.
    """

    job_id: str
    nodes: tuple[NodePlacement, ...]
    owner: str = ""
    priority: int = DEFAULT_PRIORITY
    preemptible: bool = True
    started_at: float | None = None
    timeout_s: float | None = None
    borrowed: bool = False

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    @property
    def cpu_count(self) -> int:
        return sum(n.cpu_slots for n in self.nodes)

    def expected_end(self) -> float:
        """When it ends at the latest (started_at + timeout_s); infinity when either is unknown."""
        if self.started_at is None or self.timeout_s is None:
            return math.inf
        return self.started_at + self.timeout_s


@dataclass(frozen=True)
class Quota:
    """An owner's guaranteed share: GPUs and CPU slots (None: no limit on that resource)."""

    gpus: int | None = None
    cpu_slots: int | None = None

    def __post_init__(self) -> None:
        if any(v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0) for v in (self.gpus, self.cpu_slots)):
            raise ValueError(f"quota values must be non-negative integers or None, got {self.gpus!r}, {self.cpu_slots!r}")


class Preemption(NamedTuple):
    """A running job to stop (checkpoint first) so that ``by_job_id`` fits, and why, in words."""

    victim_job_id: str
    by_job_id: str
    reason: str


@dataclass(frozen=True)
class Reservation:
    """Devices held for a queued job: nobody else gets them while it waits for them.

    Hand a decision's reservations back to the next pass. From a preemption: ``victims`` are the
    jobs stopping to make room; the job gets exactly these devices once they have left. From
    backfill: ``from_s`` is when the job is expected to start (None: when the running jobs there
    end, their timeouts unknown); the next pass keeps the hosts held and computes it again.
    """

    job_id: str
    nodes: tuple[NodePlacement, ...]
    from_s: float | None = None
    victims: tuple[str, ...] = ()


class Waiting(NamedTuple):
    """A queued job left waiting: its 1-based place among the waiting jobs, and what holds it."""

    position: int
    reason: str


@dataclass(frozen=True)
class Decision:
    """One pass: the jobs to start now, and every other queued job with its position and reason.

    ``waiting`` iterates in the order the next pass will consider the jobs. ``preemptions`` are the
    running jobs to stop; ``reservations`` the devices held for waiting jobs (hand them to the next
    pass).
    """

    placements: tuple[Placement, ...] = ()
    waiting: dict[str, Waiting] = field(default_factory=dict)
    preemptions: tuple[Preemption, ...] = ()
    reservations: tuple[Reservation, ...] = ()
