"""Checkpoints: torch.distributed.checkpoint (DCP) directories, committed atomically, plus a loader without torch.distributed.

Layout of ``RUN/checkpoints``::

    step_00000050/            one committed checkpoint (renamed into place when complete)
      .metadata, *.distcp     DCP: "model" and "optim" (sharded for FSDP, deduplicated for DDP)
      rng/rank_00000.pt       each rank's RNG state (dropout etc.)
      meta.json               step, epoch, step_in_epoch, world_size, scheduler/scaler state, data info, model
      spec.json               the job spec the run was started with
      model.safetensors       consolidated weights (final checkpoint, and any saved with weights=True)
    latest                    text file naming the newest committed directory (replaced atomically)
    .tmp-step_<8 digits>/    a save in progress; never read; removed on the next save
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchyard.atomic import write_atomic

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
LATEST = "latest"
META = "meta.json"
WEIGHTS = "model.safetensors"
SPEC = "spec.json"


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


@dataclass
class TrainPosition:
    """Where training stands: the next batch to read is ``step_in_epoch`` of ``epoch``."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    # Sum over this epoch's finished steps of the rank-averaged loss, so train/epoch_loss survives a resume.
    epoch_loss_sum: float = 0.0


def resolve_checkpoint_dir(path: str | Path) -> Path:
    """A checkpoint directory, given it, a ``checkpoints`` directory or a run directory (``latest`` is followed)."""
    path = Path(path)
    if (path / META).is_file():
        return path
    for base in (path, path / "checkpoints"):
        pointer = base / LATEST
        if pointer.is_file():
            return base / pointer.read_text(encoding="utf-8").strip()
    raise FileNotFoundError(f"{path}: not a checkpoint directory, and no {LATEST} pointer found")


def read_meta(checkpoint_dir: str | Path) -> dict[str, Any]:
    return json.loads((resolve_checkpoint_dir(checkpoint_dir) / META).read_text(encoding="utf-8"))


def load_model(checkpoint_dir: str | Path, map_location: str | torch.device = "cpu") -> nn.Module:
    """Rebuild the model a checkpoint was trained with and load its weights; no torch.distributed needed.

    Accepts a checkpoint directory, a run's ``checkpoints`` directory or a run directory. Returns the
    model in eval mode. Uses the consolidated ``model.safetensors`` when present, else reads the DCP files.
    """
    from trainer.data.base import DataInfo
    from trainer.models import build_model

    ckpt = resolve_checkpoint_dir(checkpoint_dir)
    meta = json.loads((ckpt / META).read_text(encoding="utf-8"))
    model = build_model(meta["model"]["name"], meta["model"]["args"], DataInfo.from_dict(meta["data_info"]))
    if (ckpt / WEIGHTS).is_file():
        from safetensors.torch import load_file

        model.load_state_dict(load_file(str(ckpt / WEIGHTS), device=str(map_location)))
    else:
        import warnings

        import torch.distributed.checkpoint as dcp

        state = {"model": model.state_dict()}
        with warnings.catch_warnings():
            # Without an initialised process group DCP reads in this process only (no_dist), and says so.
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp.load(state, checkpoint_id=str(ckpt))
        model.load_state_dict(state["model"])
    return model.to(map_location).eval()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on the CPU of rank 0 (empty elsewhere); a collective under FSDP."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # clone: tied weights (gpt's embedding and head) would share storage, which safetensors refuses.
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in sd.items()}


class Checkpointer:
    """Decides when to save, writes and commits checkpoints, prunes old ones, and resumes.

    Every rank calls ``save``/``load_latest`` (they are collectives); only global rank 0 touches
    the directory structure (rename, ``latest``, pruning) and emits the checkpoint event.
    """

    def __init__(self, run_dir: Path, spec: Any, rank: Any, events: Any, model_meta: dict[str, Any], data_info: Any,
                 async_group: Any = None):
        self.run_dir = run_dir
        self.dir = run_dir / "checkpoints"
        self.spec = spec
        self.rank = rank
        self.events = events
        self.model_meta = model_meta
        self.data_info = data_info
        self.every = spec.checkpoint.every_steps
        self.keep_last = spec.checkpoint.keep_last
        self.async_save = spec.checkpoint.async_save and rank.world_size >= 1
        self._async_group = async_group
        self._pending: tuple[Any, Path, str, dict[str, Any], int] | None = None
        self.last_saved_step: int | None = None

    def due(self, step: int) -> bool:
        return self.every is not None and step % self.every == 0

    # ------------------------------------------------------------------ save

    def save(self, pos: TrainPosition, event_epoch: int, model: nn.Module, optimizer: torch.optim.Optimizer,
             scheduler: Any, scaler: Any, final: bool = False) -> None:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.wait()  # one save in flight at a time: its commit must precede the next one's
        name = step_dir_name(pos.step)
        tmp = self.dir / f".tmp-{name}"
        if self.rank.is_main:
            if tmp.exists():
                shutil.rmtree(tmp)  # leftover of a save that died half-way
            (tmp / "rng").mkdir(parents=True)
        dist.barrier()
        started = time.perf_counter()
        torch.save(_rng_state(self.rank.device), tmp / "rng" / f"rank_{self.rank.rank:05d}.pt")
        model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(self.spec))
        state = {"model": model_sd, "optim": optim_sd}
        meta = {
            "format_version": FORMAT_VERSION,
            "step": pos.step,
            "epoch": pos.epoch,
            "step_in_epoch": pos.step_in_epoch,
            "epoch_loss_sum": pos.epoch_loss_sum,
            "world_size": self.rank.world_size,
            "strategy": self.spec.parallel.strategy,
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "model": self.model_meta,
            "data_info": self.data_info.to_dict(),
            "saved_at": time.time(),
        }
        if self.async_save and not final:
            # Staging copies the state to CPU before returning; the write runs in the background on a
            # separate gloo group, so training collectives never interleave with checkpoint ones.
            future = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self._async_group)
            self._pending = (future, tmp, name, meta, event_epoch)
            log.info("checkpoint %s staged in %.2fs; writing in the background", name, time.perf_counter() - started)
            return
        dcp.save(state, checkpoint_id=str(tmp))
        # A pipeline rank holds only its stages: load_model reads the whole model from the DCP shards instead.
        weights = full_weights(model) if final and self.spec.parallel.pipeline is None else None
        if self.rank.is_main:
            if weights is not None:
                from safetensors.torch import save_file

                save_file(weights, str(tmp / WEIGHTS), metadata={"format": "pt", "step": str(pos.step)})
            self._commit(tmp, name, meta, event_epoch)
        log.info("checkpoint %s saved in %.2fs", name, time.perf_counter() - started)
        self.last_saved_step = pos.step

    def poll(self) -> None:
        """Commit a finished background save without waiting for one still running."""
        if self._pending is not None and self._pending[0].done():
            self.wait()

    def wait(self) -> None:
        """Block until a background save is written, then commit it."""
        if self._pending is None:
            return
        future, tmp, name, meta, event_epoch = self._pending
        self._pending = None
        future.result()
        if self.rank.is_main:
            self._commit(tmp, name, meta, event_epoch)
        self.last_saved_step = meta["step"]

    def _commit(self, tmp: Path, name: str, meta: dict[str, Any], event_epoch: int) -> None:
        # The step's metric event first: once ``latest`` names this checkpoint, a killed attempt resumes after its step.
        self.events.settle()
        _write_json(tmp / META, meta)
        _write_json(tmp / SPEC, self.spec.model_dump(mode="json"))
        final = self.dir / name
        if final.exists():
            shutil.rmtree(final)  # the same step saved again (a restart that re-ran it): newest wins
        os.rename(tmp, final)
        write_atomic(self.dir / LATEST, name)
        _fsync_dir(self.dir)
        self._prune(keep=name)
        size = sum(f.stat().st_size for f in final.rglob("*") if f.is_file())
        extra: dict[str, Any] = {"bytes": size}
        if (final / WEIGHTS).is_file():
            extra["weights"] = f"checkpoints/{name}/{WEIGHTS}"
        self.events.checkpoint(meta["step"], event_epoch, f"checkpoints/{name}", **extra)

    def _prune(self, keep: str) -> None:
        steps = sorted(p for p in self.dir.iterdir() if p.is_dir() and p.name.startswith("step_"))
        for old in steps[: max(0, len(steps) - self.keep_last)]:
            if old.name != keep:
                shutil.rmtree(old, ignore_errors=True)

    # ------------------------------------------------------------------ resume

    def load_latest(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, scaler: Any) -> TrainPosition | None:
        """Restore everything from ``latest`` if there is one; None for a fresh start."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        pointer = self.dir / LATEST
        if not pointer.is_file():
            return None
        ckpt = self.dir / pointer.read_text(encoding="utf-8").strip()
        meta = json.loads((ckpt / META).read_text(encoding="utf-8"))
        if meta["model"] != self.model_meta:
            raise ValueError(f"{ckpt}: checkpoint is of model {meta['model']}, this job trains {self.model_meta}")
        started = time.perf_counter()
        model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(self.spec))
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(ckpt))  # DCP reshards when the world size changed
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=_options(self.spec))
        scheduler.load_state_dict(meta["scheduler"])
        if scaler is not None and meta.get("scaler"):
            scaler.load_state_dict(meta["scaler"])
        rng_file = ckpt / "rng" / f"rank_{self.rank.rank:05d}.pt"
        if rng_file.is_file() and meta["world_size"] == self.rank.world_size:
            _set_rng_state(torch.load(rng_file, weights_only=True), self.rank.device)
        else:
            log.warning("world size changed (%d -> %d): RNG streams are not restored", meta["world_size"], self.rank.world_size)
        self.last_saved_step = meta["step"]
        log.info("resumed from %s (step %d) in %.2fs", ckpt.name, meta["step"], time.perf_counter() - started)
        return TrainPosition(meta["step"], meta["epoch"], meta["step_in_epoch"], meta.get("epoch_loss_sum", 0.0))


def _options(spec: Any) -> Any:
    """Pipeline ranks hold different parameters, so their optimizer param_groups differ, and DCP keeps one copy of
    a non-tensor entry: flattened, each parameter's group settings get a key of their own (as torchtitan saves)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=spec.parallel.pipeline is not None)


def _fsync_dir(path: Path) -> None:
    # Make the rename and pointer update durable before announcing the checkpoint.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
