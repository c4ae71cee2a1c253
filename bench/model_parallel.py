"""(8) Model parallelism at 2 ranks on the CPU: gpt under DDP, FSDP2, a 2-stage pipeline and 2-way tensor
parallelism, side by side in one invocation (rounds interleaved A B C D, then D C B A; ratios to DDP taken
per round before the median). Samples/s from the trainer's metric events; parameters per rank from its
``done`` event (what each rank holds after training)."""

from __future__ import annotations

import logging
from typing import Any

from bench.common import Ctx, median, metric_times, window_rate
from bench.training import _order, run_trainer

log = logging.getLogger("bench.model_parallel")

GPT = {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "tie_embeddings": False}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ddp": ("ddp", {}),
    "fsdp": ("fsdp", {}),
    "pp2": ("ddp", {"pipeline": {"stages": 2, "microbatches": 4, "schedule": "1f1b"}}),
    "tp2": ("ddp", {"tensor": 2}),
}


def gpt_spec(name: str, steps: int, log_every: int, batch: int, strategy: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"name": "gpt", "args": GPT},
        "data": {"name": "synthetic-lm", "args": {"samples": 4096, "eval_samples": 0, "vocab_size": 256, "seq_len": 64}},
        "parallel": {"strategy": strategy, "nproc_per_node": 2, "device": "cpu", **extra},
        "train": {"epochs": 1000, "max_steps": steps, "global_batch_size": batch, "lr": 1e-3, "log_every_steps": log_every},
        "checkpoint": {"keep_last": 1},
    }


def model_parallel(ctx: Ctx) -> dict[str, Any]:
    batch, steps, every = 16, 16 if ctx.quick else 30, 2
    start = steps // 3
    rounds = 1 if ctx.quick else 2
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for v in _order(list(VARIANTS), r):
            strategy, extra = VARIANTS[v]
            _, events, _ = run_trainer(ctx, f"mp-{v}", gpt_spec(f"bench-{v}", steps, every, batch, strategy, extra))
            sps, step_time = window_rate(metric_times(events), start, batch)
            done = next(e for e in events if e.get("type") == "status" and e.get("phase") == "done")
            rows[v].append({"samples_per_s": sps, "step_time_ms": step_time * 1e3, "params_per_rank": done["local_param_numel"]})
            log.info("round %d %-5s %7.1f samples/s  params per rank %s", r + 1, v, sps, done["local_param_numel"])
    whole = rows["ddp"][0]["params_per_rank"][0]
    return {
        "config": {"model": f"gpt {GPT}", "params": whole, "ranks": 2, "global_batch": batch, "steps": steps,
                   "window": f"steps {start}..{steps}", "rounds": rounds},
        "runs": rows,
        "summary": {v: {"samples_per_s": median([x["samples_per_s"] for x in rows[v]]),
                        "max_params_per_rank": max(rows[v][-1]["params_per_rank"]),
                        "params_fraction": max(rows[v][-1]["params_per_rank"]) / whole} for v in rows},
        "ratios": {f"{v}/ddp samples_per_s": median([x["samples_per_s"] / d["samples_per_s"]
                                                     for x, d in zip(rows[v], rows["ddp"], strict=True)]) for v in rows if v != "ddp"},
    }
