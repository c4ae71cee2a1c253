"""Rank facts and process-group setup, read once from the torchrun environment."""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class RankInfo:
    """Who this process is. Read once at start; never re-read from the environment."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def nnodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))


def _pick_device(requested: str, local_rank: int) -> torch.device:
    if requested != "cpu" and torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    if requested == "cuda":
        raise RuntimeError("parallel.device is 'cuda' but CUDA is not available on this host")
    return torch.device("cpu")


def _restart_scoped_store(rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store | None:
    """torchrun's agent store, with keys scoped to this restart of the worker group.

    After an in-attempt restart the ranks rejoin the same agent store; seen under load, a
    restarted rank then read a dead peer's address left by the previous generation and its gloo
    mesh connect failed. A prefix per TORCHELASTIC_RESTART_COUNT makes every generation's keys
    its own. None when torchrun did not offer its store (a plain env:// start)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=timeout)
    return dist.PrefixStore(f"torchyard/restart_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def init_distributed(requested_device: str = "auto", timeout_s: float = 1800.0) -> RankInfo:
    """Join the process group torchrun set up (or a single-process one when started by hand).

    The rendezvous address comes from torchrun's environment; MASTER_PORT is never chosen here.
    """
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    device = _pick_device(requested_device, local_rank)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            # Started by hand without torchrun: a one-rank group over a local file store, so the
            # same code path (collectives, DCP) runs; no TCP port is picked.
            if world_size != 1:
                raise RuntimeError("WORLD_SIZE > 1 without MASTER_ADDR: start the trainer with torchrun")
            import tempfile

            store = dist.FileStore(tempfile.mktemp(prefix="torchyard-store-"), 1)
            dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=timeout_s))
        else:
            kwargs = {"device_id": device} if device.type == "cuda" else {}
            timeout = datetime.timedelta(seconds=timeout_s)
            store = _restart_scoped_store(rank, world_size, timeout)
            if store is not None:
                dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **kwargs)
            else:
                dist.init_process_group(backend, timeout=timeout, **kwargs)
    info = RankInfo(rank, local_rank, world_size, local_world_size, device, backend)
    log.info("rank %d/%d local_rank %d device %s backend %s", rank, world_size, local_rank, device, backend)
    return info


def shutdown(barrier: bool = False) -> None:
    if dist.is_initialized():
        if barrier and dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
