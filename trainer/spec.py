"""JobSpec: the one definition of a training job.

Imported by the API (validation at POST), the worker (what to launch) and the
trainer (what to train). It must stay importable without torch.

Validation happens in two layers:

* field bounds, enforced by pydantic when a spec is parsed;
* rules that span fields or depend on the host (``spec_problems``): batch
  divisible by ranks, model/data compatibility, data paths under the data root,
  process counts within what the workers allow. Each problem names its field.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainer import catalog

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
LABEL_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Strict):
    name: str = Field(..., min_length=1, max_length=64, description="Catalog model: mlp, cnn, resnet, vit, gpt or a plugin's.")
    args: dict[str, Any] = Field(default_factory=dict, description="Model arguments; see docs/spec.md per model.")


class DataSpec(_Strict):
    name: str = Field(..., min_length=1, max_length=64, description="Catalog dataset or a plugin's.")
    args: dict[str, Any] = Field(default_factory=dict, description="Dataset arguments; see docs/spec.md per dataset.")
    num_workers: int = Field(0, ge=0, le=32, description="DataLoader worker processes per rank.")


class DDPOptions(_Strict):
    bucket_cap_mb: int = Field(25, ge=1, le=1024, description="Gradient bucket size for all-reduce.")
    gradient_as_bucket_view: bool = Field(True, description="Gradients alias the buckets (saves a copy).")
    find_unused_parameters: bool = False
    static_graph: bool = False


class FSDPOptions(_Strict):
    reshard_after_forward: bool = Field(
        True, description="True: full shard (ZeRO-3). False: keep parameters gathered between forward and backward (ZeRO-2).",
    )
    cpu_offload: bool = Field(False, description="Keep sharded parameters, gradients and optimizer state on the CPU.")
    hsdp: bool = Field(True, description="With nnodes > 1: replicate across nodes, shard within a node (2-D mesh).")


class ParallelSpec(_Strict):
    strategy: Literal["ddp", "fsdp"] = Field("ddp", description="Data parallelism: DDP or FSDP2 (fully_shard).")
    nnodes: int = Field(1, ge=1, le=64, description="Workers (hosts or containers) the job spans.")
    nproc_per_node: int = Field(1, ge=1, le=64, description="Processes (ranks) per node; one per GPU on GPU hosts.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA with NCCL when there is a GPU, else CPU with gloo.")
    ddp: DDPOptions = Field(default_factory=DDPOptions)
    fsdp: FSDPOptions = Field(default_factory=FSDPOptions)

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


class ScheduleSpec(_Strict):
    name: Literal["constant", "cosine"] = Field("constant", description="LR after warmup.")
    warmup_steps: int = Field(0, ge=0, le=10_000_000, description="Linear warmup from 0 to lr.")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="Cosine floor as a fraction of lr.")


class TrainSpec(_Strict):
    epochs: int = Field(1, ge=1, le=100_000, description="Passes over the training set.")
    max_steps: int | None = Field(None, ge=1, le=100_000_000, description="Optimizer steps cap; ends training early.")
    global_batch_size: int = Field(64, ge=1, le=1_048_576, description="Samples per optimizer step, summed over ranks and accumulation.")
    grad_accum_steps: int = Field(1, ge=1, le=1024, description="Micro-batches accumulated per optimizer step.")
    lr: float = Field(1e-3, gt=0.0, le=10.0, description="Peak learning rate.")
    optimizer: Literal["adamw", "sgd"] = "adamw"
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="SGD momentum.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas, each in [0, 1).")
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="fp16 uses a gradient scaler.")
    grad_clip: float | None = Field(1.0, gt=0.0, le=1e6, description="Max global gradient norm; null disables clipping.")
    activation_checkpointing: bool = Field(False, description="Recompute block activations in backward.")
    compile: bool = Field(False, description="torch.compile the model.")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    log_every_steps: int = Field(10, ge=1, le=1_000_000, description="Steps between train/* metric events.")


class EvalSpec(_Strict):
    every_steps: int | None = Field(None, ge=1, le=100_000_000, description="Evaluate every N steps; always at the end.")
    max_batches: int | None = Field(None, ge=1, le=1_000_000, description="Cap on eval batches per evaluation.")


class CheckpointSpec(_Strict):
    every_steps: int | None = Field(None, ge=1, le=100_000_000, description="Save every N steps; always at the end.")
    keep_last: int = Field(3, ge=1, le=1000, description="Step checkpoints kept; older ones are deleted.")
    async_save: bool = Field(False, description="Save in the background so training is not blocked.")


class JobSpec(_Strict):
    """A catalog training job: a model from the catalog trained on a dataset from the catalog."""

    kind: Literal["catalog"] = "catalog"
    name: str = Field(..., pattern=NAME_PATTERN, description="Human name; letters, digits, '.', '_' and '-'.")
    model: ModelSpec
    data: DataSpec
    parallel: ParallelSpec = Field(default_factory=ParallelSpec)
    train: TrainSpec = Field(default_factory=TrainSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    max_restarts: int = Field(0, ge=0, le=100, description="torchrun restarts of all ranks inside one attempt.")
    retries: int = Field(0, ge=0, le=100, description="Further whole-job attempts, each resuming from the latest checkpoint.")
    timeout_s: int = Field(86_400, ge=1, le=30 * 86_400, description="Wall-clock limit of one attempt.")
    stall_timeout_s: int | None = Field(None, ge=10, le=86_400, description="No new step for this long stops the attempt.")
    queue: str = Field("default", pattern=NAME_PATTERN, description="RQ queue the job waits in.")
    labels: dict[str, str] = Field(default_factory=dict, max_length=32, description="Free-form labels for filtering.")


@dataclass(frozen=True)
class SpecLimits:
    """What the host allows; checked at submission so a bad job never reaches a GPU."""

    max_nproc_per_node: int = 64
    max_nnodes: int = 64
    data_dir: Path | None = None


@dataclass(frozen=True)
class SpecProblem:
    loc: tuple[str | int, ...]
    msg: str

    @property
    def field(self) -> str:
        return ".".join(str(p) for p in self.loc)


class SpecError(ValueError):
    """A spec that parses but cannot run. Carries one problem per offending field."""

    def __init__(self, problems: list[SpecProblem]):
        self.problems = problems
        super().__init__("; ".join(f"{p.field}: {p.msg}" for p in problems))


def _args_problems(section: str, entry: catalog.CatalogEntry, args: dict[str, Any]) -> list[SpecProblem]:
    try:
        catalog.validate_args(entry, args)
    except ValidationError as exc:
        return [SpecProblem((section, "args", *err["loc"]), err["msg"]) for err in exc.errors()]
    return []


def resolve_under(root: Path, relative: str) -> Path | None:
    """``root/relative`` resolved (symlinks too) if it stays under root, else None."""
    if not relative or "\x00" in relative or os.path.isabs(relative):
        return None
    root = root.resolve()
    target = (root / relative).resolve()
    return target if target == root or root in target.parents else None


def spec_problems(spec: JobSpec, limits: SpecLimits | None = None) -> list[SpecProblem]:
    """Every reason this spec cannot run; empty when it can."""
    limits = limits or SpecLimits()
    problems: list[SpecProblem] = []

    model = catalog.model_entry(spec.model.name)
    if model is None:
        problems.append(SpecProblem(("model", "name"), f"unknown model {spec.model.name!r}; known: {', '.join(catalog.known_models())}"))
    else:
        problems += _args_problems("model", model, spec.model.args)

    data = catalog.dataset_entry(spec.data.name)
    if data is None:
        problems.append(SpecProblem(("data", "name"), f"unknown dataset {spec.data.name!r}; known: {', '.join(catalog.known_datasets())}"))
    else:
        problems += _args_problems("data", data, spec.data.args)

    if model is not None and data is not None:
        problems += _compatibility_problems(spec, model, data)

    p, t = spec.parallel, spec.train
    per_step = p.world_size * t.grad_accum_steps
    if t.global_batch_size % per_step:
        problems.append(SpecProblem(
            ("train", "global_batch_size"),
            f"{t.global_batch_size} is not divisible by ranks x grad_accum_steps = "
            f"{p.world_size} x {t.grad_accum_steps} = {per_step}",
        ))
    if not all(0.0 <= b < 1.0 for b in t.betas):
        problems.append(SpecProblem(("train", "betas"), "each beta must be in [0, 1)"))
    if t.precision == "fp16" and p.device == "cpu":
        problems.append(SpecProblem(("train", "precision"), "fp16 needs CUDA; use bf16 or fp32 on the CPU"))
    if p.nproc_per_node > limits.max_nproc_per_node:
        problems.append(SpecProblem(
            ("parallel", "nproc_per_node"),
            f"{p.nproc_per_node} processes per node; this service allows at most {limits.max_nproc_per_node}",
        ))
    if p.nnodes > limits.max_nnodes:
        problems.append(SpecProblem(("parallel", "nnodes"), f"{p.nnodes} nodes; this service allows at most {limits.max_nnodes}"))

    for key in spec.labels:
        if not re.match(LABEL_KEY_PATTERN, key):
            problems.append(SpecProblem(("labels", key), "label keys are letters, digits, '.', '_', '/' and '-', at most 63"))
        elif len(spec.labels[key]) > 256:
            problems.append(SpecProblem(("labels", key), "label values are at most 256 characters"))

    if limits.data_dir is not None:
        for name in catalog.DATA_PATH_FIELDS:
            value = spec.data.args.get(name)
            if value is None:
                continue
            resolved = resolve_under(limits.data_dir, str(value))
            if resolved is None:
                problems.append(SpecProblem(("data", "args", name), f"{value!r} is outside the data root"))
            elif not resolved.is_file():
                problems.append(SpecProblem(("data", "args", name), f"{value!r} does not exist under the data root"))
    return problems


def _compatibility_problems(spec: JobSpec, model: catalog.CatalogEntry, data: catalog.CatalogEntry) -> list[SpecProblem]:
    problems: list[SpecProblem] = []
    data_task = data.task
    if spec.data.name == "tensor-file":
        data_task = spec.data.args.get("task", "classification")
    if model.task != "any" and data_task != "any" and model.task != data_task:
        problems.append(SpecProblem(
            ("model", "name"), f"model {spec.model.name!r} trains on {model.task} data, dataset {spec.data.name!r} is {data_task}",
        ))
    if model.task == "any" and data_task == "lm" and model.input != "any":
        problems.append(SpecProblem(("model", "name"), f"model {spec.model.name!r} does not take token sequences; use gpt"))
    image = spec.data.name == "synthetic-classification" and spec.data.args.get("image_size") is not None
    if model.input == "image" and spec.data.name == "synthetic-classification" and not image:
        problems.append(SpecProblem(("data", "args", "image_size"), f"model {spec.model.name!r} needs image inputs; set image_size"))
    if model.input == "vector" and image:
        problems.append(SpecProblem(("data", "args", "image_size"), f"model {spec.model.name!r} takes vectors; leave image_size unset"))
    if spec.model.name == "gpt":
        block = spec.model.args.get("block_size", catalog.GPTArgs.model_fields["block_size"].default)
        seq = spec.data.args.get("seq_len", 64)
        if isinstance(block, int) and isinstance(seq, int) and seq > block:
            problems.append(SpecProblem(("data", "args", "seq_len"), f"{seq} exceeds the model's block_size {block}"))
        n_embd = spec.model.args.get("n_embd", catalog.GPTArgs.model_fields["n_embd"].default)
        n_head = spec.model.args.get("n_head", catalog.GPTArgs.model_fields["n_head"].default)
        if isinstance(n_embd, int) and isinstance(n_head, int) and n_head and n_embd % n_head:
            problems.append(SpecProblem(("model", "args", "n_embd"), f"{n_embd} is not divisible by n_head {n_head}"))
    if spec.model.name == "vit":
        dim = spec.model.args.get("dim", catalog.ViTArgs.model_fields["dim"].default)
        heads = spec.model.args.get("heads", catalog.ViTArgs.model_fields["heads"].default)
        if isinstance(dim, int) and isinstance(heads, int) and heads and dim % heads:
            problems.append(SpecProblem(("model", "args", "dim"), f"{dim} is not divisible by heads {heads}"))
        patch = spec.model.args.get("patch_size", catalog.ViTArgs.model_fields["patch_size"].default)
        size = spec.data.args.get("image_size")
        if isinstance(size, int) and isinstance(patch, int) and patch and size % patch:
            problems.append(SpecProblem(("data", "args", "image_size"), f"{size} is not divisible by the model's patch_size {patch}"))
    return problems


def parse_spec(raw: dict[str, Any] | str | bytes, limits: SpecLimits | None = None) -> JobSpec:
    """Parse and check a spec; raises pydantic.ValidationError or SpecError."""
    spec = JobSpec.model_validate_json(raw) if isinstance(raw, (str, bytes)) else JobSpec.model_validate(raw)
    problems = spec_problems(spec, limits)
    if problems:
        raise SpecError(problems)
    return spec


def load_spec_file(path: str | Path, limits: SpecLimits | None = None) -> JobSpec:
    """Read a spec from a .json or .yaml file, as the trainer does when started by hand."""
    text = Path(path).read_text(encoding="utf-8")
    if str(path).endswith((".yaml", ".yml")):
        import yaml

        return parse_spec(yaml.safe_load(text), limits)
    return parse_spec(json.loads(text), limits)
