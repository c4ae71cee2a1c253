"""An attempt's placement as the job row stores it (``[{"node_rank", "host", "gpus", "cpu_slots"}]``, node 0 first),
read for people: how errors and reasons name a node."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def node_label(node_rank: int, host: str | None) -> str:
    """``node 1 (host gpu-b)``: the node as torchrun numbers it, and where it ran, so no reader maps ranks to hosts."""
    return f"node {node_rank}" + (f" (host {host})" if host else "")


def host_of(placement: Iterable[Mapping[str, Any]] | None, node_rank: int) -> str | None:
    return next((n.get("host") for n in placement or () if n.get("node_rank") == node_rank), None)
