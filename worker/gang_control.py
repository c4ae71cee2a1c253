"""Node 0's side of a multi-node attempt (the followers' side is worker/node.py): telling the other nodes to
stop, telling a peer's lost host from a training error, and finding the node whose ranks failed first."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from jobs.hosts.placement import host_of, node_label
from worker import node as nodes
from worker import outcome
from worker.launch import NodeLaunch
from worker.lease import Lease

log = logging.getLogger(__name__)


class Gang:
    """The other nodes of the attempt the lease holds; with nnodes == 1 every call is a no-op."""

    def __init__(self, lease: Lease):
        self.lease = lease
        self.nnodes = 1
        # The scheduler's placement of the adopted attempt: one entry per node.
        self.placement: list[dict[str, object]] | None = None

    def meet(self) -> NodeLaunch | None:
        """Where the gang meets (torchrun's rendezvous on this host), published for the other nodes: once the endpoint
        is in SQL they start their ranks. None for a one-node attempt."""
        if self.nnodes <= 1:
            return None
        lease = self.lease
        assert lease.attempt is not None
        endpoint = nodes.rendezvous_endpoint(lease.settings)
        node = nodes.node_launch(lease.settings, lease.job_id, lease.attempt, self.nnodes, 0, endpoint)
        lease.db(lambda: nodes.say(lease.session, lease.job_id, lease.attempt, lease.worker_id, nodes.ENDPOINT, endpoint),  # type: ignore[arg-type]
                 "publishing the rendezvous endpoint")
        log.info("job %s attempt %d: gang of %d meets at %s", lease.job_id, lease.attempt, self.nnodes, endpoint,
                 extra=lease.log_extra)
        return node

    def stop(self) -> None:
        """Tell the other nodes to stop their ranks now (a checkpoint on SIGTERM is a collective of every node)."""
        lease = self.lease
        if self.nnodes > 1 and lease.attempt is not None:
            nodes.say(lease.session, lease.job_id, lease.attempt, lease.worker_id, nodes.STOP, True)

    def stop_quietly(self) -> None:
        try:
            self.stop()
        except Exception:  # noqa: BLE001 - giving up anyway; the followers stop once the job leaves this attempt
            log.warning("job %s: could not tell the gang to stop", self.lease.job_id, extra=self.lease.log_extra)

    def lost(self) -> list[tuple[int, str]]:
        """After node 0's ranks failed: the nodes whose host died, waited for up to a lease (a host is dead once its
        heartbeat is a lease old), so a peer's crash is told apart from a training error. Heartbeats meanwhile."""
        if self.nnodes <= 1:
            return []
        lease = self.lease
        ttl = lease.settings.lease_ttl_s
        deadline = time.monotonic() + ttl * 1.2
        while True:
            with contextlib.suppress(SQLAlchemyError):
                dead = nodes.dead_nodes(lease.session, self.placement, ttl)  # type: ignore[arg-type]
                if dead:
                    return dead
            if time.monotonic() >= deadline or lease.lost:
                return []
            lease.try_heartbeat()
            time.sleep(0.5)

    def failure(self, run_dir: Path, attempt: int, own: outcome.Failure) -> outcome.Failure:
        """The job's failure: of node 0's own (``own``) and each other node's, as its error file tells it, the one
        whose rank failed first (outcome.first_of_nodes), node 0's where no node left a traceback. Its message starts
        with the node and its host (``node 1 (host gpu-b): rank 3: ...``), so a reader need not map ranks to hosts."""
        if self.nnodes <= 1:
            return own
        found = [own]
        for rank in range(1, self.nnodes):
            other = outcome.failure(1, run_dir / f"error-node-{rank}.json",
                                    run_dir / "logs" / f"attempt-{attempt}" / f"launcher-node-{rank}.log")
            found.append(dataclasses.replace(other, exit_code=None))
        chosen = outcome.first_of_nodes(found)
        node = next((i for i, f in enumerate(found) if f is chosen), 0)
        failure = found[node]
        return dataclasses.replace(failure, message=f"{self.where(node)}: {failure.message}")

    def where(self, node_rank: int) -> str:
        """``node <k> (host <h>)``, the host from the attempt's placement."""
        return node_label(node_rank, host_of(self.placement, node_rank))
