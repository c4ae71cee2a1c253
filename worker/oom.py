"""OOM recovery (``train.auto_micro_batch``): the spec of the next attempt after one that ran out of memory.

Halving the micro-batch and doubling ``grad_accum_steps`` keeps the global batch, hence the samples of
each optimizer step and the loss curve, while each forward holds half the activations. Torch-free.
"""

from __future__ import annotations

import copy
from typing import Any

from jobspec.view import StoredSpec

MAX_GRAD_ACCUM = 1024  # TrainSpec.grad_accum_steps' upper bound


def halved_micro_batch(spec: dict[str, Any], attempt: int, ranks: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the adjusted spec, a record of the change) for the attempt after ``attempt`` of a job of ``ranks``
    ranks, or None when the job did not ask for it or the
    micro-batch cannot be halved (one sample, or an odd one)."""
    if StoredSpec.of(spec).kind != "catalog":
        return None
    train = spec.get("train") or {}
    if not train.get("auto_micro_batch"):
        return None
    if StoredSpec.of(spec).pipeline:
        return None  # a pipeline accumulates over its own micro-batches; grad_accum_steps stays 1
    accum = int(train.get("grad_accum_steps", 1))
    global_batch = int(train.get("global_batch_size", 64))
    micro = global_batch // (ranks * accum)
    if micro < 2 or micro % 2 or accum * 2 > MAX_GRAD_ACCUM:
        return None
    adjusted = copy.deepcopy(spec)
    adjusted["train"]["grad_accum_steps"] = accum * 2
    change = {
        "attempt": attempt + 1, "reason": "out_of_memory",
        "field": "train.grad_accum_steps", "from": accum, "to": accum * 2,
        "micro_batch": {"from": micro, "to": micro // 2},
    }
    return adjusted, change
