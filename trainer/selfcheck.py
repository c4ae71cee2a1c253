"""``python -m trainer.selfcheck [--compile]``: prove this Python environment can run every catalog job.

The worker image runs it at build time, so an image that lacks a package (numpy for DCP and
``.npz`` files, safetensors, a compiler for ``train.compile``) fails to build instead of failing a
user's first job. It is just as useful in a running container
(``docker compose exec worker python -m trainer.selfcheck``).

What it runs, each for two steps in a one-process gloo group on the CPU (the same code path a
torchrun rank takes, without starting torchrun):

- every catalog model (mlp, cnn, resnet, vit, gpt) under DDP or FSDP2;
- every data format: synthetic classification/regression/LM, ``tensor-file`` as ``.pt``,
  ``.npz`` and ``.safetensors``, and ``text-file``;
- every checkpoint path: DCP save (synchronous and ``async_save``), the final consolidated
  ``model.safetensors``, a resume through DCP load in the process group, and ``load_model`` of a
  step checkpoint without a process group;
- with ``--compile``, ``train.compile`` (TorchInductor needs a C++ compiler and Python's headers).

Exit status 0 when everything ran; otherwise the first failure's traceback and status 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("trainer.selfcheck")

# A feature-vector and an image data set, small enough to train two steps in well under a second.
_VECTORS = (64, 8)
_IMAGES = (64, 3, 8, 8)
_CLASSES = 4


def _base(name: str, model: dict[str, Any], data: dict[str, Any], strategy: str = "ddp", **train: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": model,
        "data": data,
        "parallel": {"strategy": strategy, "nproc_per_node": 1, "device": "cpu"},
        "train": {"epochs": 1, "max_steps": 2, "global_batch_size": 16, "log_every_steps": 1, **train},
        "eval": {"max_batches": 1},
        "checkpoint": {"every_steps": 1, "keep_last": 3},
    }


def _jobs() -> list[dict[str, Any]]:
    image_data = {"name": "synthetic-classification", "args": {"samples": 64, "eval_samples": 16, "image_size": 8, "classes": _CLASSES}}
    return [
        _base("mlp-npz-async", {"name": "mlp", "args": {"hidden": 16}}, {"name": "tensor-file", "args": {"path": "vectors.npz"}})
        | {"checkpoint": {"every_steps": 1, "keep_last": 3, "async_save": True}},
        _base("mlp-regression", {"name": "mlp", "args": {"hidden": 16}},
              {"name": "synthetic-regression", "args": {"samples": 64, "eval_samples": 16, "features": 8}}),
        _base("cnn-pt", {"name": "cnn", "args": {"channels": 4, "blocks": 1}},
              {"name": "tensor-file", "args": {"path": "images.pt", "eval_path": "images.pt"}}),
        _base("resnet-fsdp", {"name": "resnet", "args": {"width": 4, "blocks_per_stage": [1, 1]}}, image_data, "fsdp"),
        _base("vit-safetensors-fsdp", {"name": "vit", "args": {"patch_size": 4, "dim": 16, "depth": 1, "heads": 2}},
              {"name": "tensor-file", "args": {"path": "images.safetensors"}}, "fsdp"),
        _base("gpt-text-fsdp", {"name": "gpt", "args": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16}},
              {"name": "text-file", "args": {"path": "corpus.txt", "seq_len": 16}}, "fsdp"),
        _base("gpt-lm-bf16", {"name": "gpt", "args": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16}},
              {"name": "synthetic-lm", "args": {"samples": 64, "eval_samples": 16, "vocab_size": 32, "seq_len": 16}},
              precision="bf16"),
    ]


def _compile_job() -> dict[str, Any]:
    return _base("gpt-compile", {"name": "gpt", "args": {"n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 16}},
                 {"name": "synthetic-lm", "args": {"samples": 64, "eval_samples": 0, "vocab_size": 32, "seq_len": 16}},
                 compile=True)


def write_data_files(data_dir: Path) -> None:
    """The same tensors in every tensor-file format the catalog reads, and a UTF-8 text file."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    data_dir.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    vectors = {"x": torch.randn(*_VECTORS, generator=gen), "y": torch.randint(0, _CLASSES, (_VECTORS[0],), generator=gen)}
    images = {"x": torch.randn(*_IMAGES, generator=gen), "y": torch.randint(0, _CLASSES, (_IMAGES[0],), generator=gen)}
    np.savez(data_dir / "vectors.npz", **{k: v.numpy() for k, v in vectors.items()})
    torch.save(images, data_dir / "images.pt")
    save_file(images, str(data_dir / "images.safetensors"))
    (data_dir / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog; " * 40, encoding="utf-8")


def _events(run_dir: Path) -> list[dict[str, Any]]:
    from torchyard.events import EVENTS_FILE

    return [json.loads(line) for line in (run_dir / EVENTS_FILE).read_text(encoding="utf-8").splitlines() if line.strip()]


def _train(raw: dict[str, Any], run_dir: Path, rank: Any, data_dir: Path) -> list[dict[str, Any]]:
    from jobspec.spec import JobSpec, SpecLimits, parse_spec
    from trainer import loop

    spec = parse_spec(raw, SpecLimits(data_dir=data_dir))
    assert isinstance(spec, JobSpec)
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    code = loop.run(spec, run_dir, rank, data_dir)
    if code != 0:
        raise RuntimeError(f"{spec.name}: the trainer exited with {code}")
    events = _events(run_dir)
    if not any(e["type"] == "status" and e.get("phase") == "done" for e in events):
        raise RuntimeError(f"{spec.name}: no 'done' event in {run_dir}")
    log.info("ok  %-22s %.1fs", spec.name, time.perf_counter() - started)
    return events


def _check_checkpoints(run_dir: Path, events: list[dict[str, Any]]) -> None:
    """Both loaders of trainer.checkpoint: the final safetensors weights, and DCP files without a process group."""
    import torch

    from trainer.checkpoint import WEIGHTS, load_model, resolve_checkpoint_dir, step_dir_name

    final = resolve_checkpoint_dir(run_dir)
    if not (final / WEIGHTS).is_file():
        raise RuntimeError(f"{final}: the final checkpoint has no {WEIGHTS}")
    first = run_dir / "checkpoints" / step_dir_name(1)
    if (first / WEIGHTS).exists():
        raise RuntimeError(f"{first}: a step checkpoint should hold DCP files only")
    from_weights, from_dcp = load_model(run_dir), load_model(first)
    if not isinstance(from_weights, torch.nn.Module) or not isinstance(from_dcp, torch.nn.Module):
        raise RuntimeError("load_model returned no module")
    saved = [e["step"] for e in events if e["type"] == "checkpoint"]
    if saved[:2] != [1, 2]:
        raise RuntimeError(f"checkpoint events at steps {saved}, expected 1 and 2 first")


def run(work_dir: Path, compile_model: bool = False) -> None:
    """Every check, in one process and one gloo group; raises on the first failure."""
    from trainer import distributed

    data_dir = work_dir / "data"
    write_data_files(data_dir)
    rank = distributed.init_distributed("cpu")
    try:
        jobs = _jobs()
        for raw in jobs:
            events = _train(raw, work_dir / "runs" / raw["name"], rank, data_dir)
        first = jobs[0]
        _check_checkpoints(work_dir / "runs" / first["name"], _events(work_dir / "runs" / first["name"]))
        # Resume: the same run directory with a higher step cap loads the latest checkpoint through DCP.
        resumed = first | {"train": first["train"] | {"max_steps": 3}}
        events = _train(resumed, work_dir / "runs" / first["name"], rank, data_dir)
        starts = [e.get("resumed_from_step") for e in events if e["type"] == "status" and e.get("phase") == "training"]
        if starts != [0, 2]:
            raise RuntimeError(f"{first['name']}: training started from steps {starts}, expected 0 then (resumed) 2")
        if compile_model:
            job = _compile_job()
            _train(job, work_dir / "runs" / job["name"], rank, data_dir)
    finally:
        distributed.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.selfcheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--compile", action="store_true", help="also train with train.compile (needs a C++ compiler)")
    parser.add_argument("--log-level", default="WARNING", help="of the trainer's own logging; the checks log at INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    log.setLevel(logging.INFO)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="torchyard-selfcheck-") as work:
        try:
            run(Path(work), compile_model=args.compile)
        except Exception:
            log.exception("selfcheck failed")
            return 1
    log.info("selfcheck passed in %.1fs", time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
