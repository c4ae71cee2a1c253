"""Rules of a job spec that span fields or depend on the host (jobspec/spec.py has the schema): batch divisible by
ranks, model and data compatible (as their catalog entries say), meshes that can be built, data paths under the data
root, process counts within what the workers allow, queues that exist, entrypoints and environment names on their
allow-lists, sizes. Each problem names its field."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from jobspec import catalog
from jobspec.env_rules import env_name_problem, name_problem
from jobspec.messages import user_problems
from jobspec.paths import data_file, resolve_entrypoint
from jobspec.requirements import requirement_problem
from jobspec.resume_args import template_problem

if TYPE_CHECKING:  # the schema imports this module: its classes are only named here
    from jobspec.spec import JobBase, JobSpec, ScriptJobSpec

LABEL_KEY_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$"
# Totals, so a spec stays small wherever it is stored, listed and sent (SQL, spec.json, responses).
ARGS_TOTAL_MAX = 65_536  # characters of all script args together
ENV_TOTAL_MAX = 32_768  # characters of all env names and values
SECRETS_TOTAL_MAX = 65_536  # characters of all secret names and values
CATALOG_ARGS_MAX = 16_384  # characters of model.args or data.args as JSON


@dataclass(frozen=True)
class SpecLimits:
    """What the host allows; checked at submission so a bad job never reaches a GPU."""

    max_nproc_per_node: int = 64
    max_nnodes: int = 64
    data_dir: Path | None = None
    code_dir: Path | None = None  # script jobs' entrypoints must resolve under it
    script_modules: frozenset[str] = frozenset()  # installed modules a script job may run (TORCHYARD_SCRIPT_MODULES)
    queues: frozenset[str] | None = None  # the queues that exist (TORCHYARD_QUEUES); None: any
    secrets_allowed: bool = True  # False where no key can encrypt them (TORCHYARD_SECRETS_KEY unset)


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
        return [SpecProblem((section, "args", *loc), msg) for loc, msg in user_problems(exc.errors(), [entry.args])]
    return []


def spec_problems(spec: JobSpec | ScriptJobSpec, limits: SpecLimits | None = None) -> list[SpecProblem]:
    """Every reason this spec cannot run; empty when it can."""
    limits = limits or SpecLimits()
    if spec.kind == "script":
        return _common_problems(spec, limits) + script_problems(spec, limits)  # type: ignore[arg-type]
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
    for section in ("model", "data"):
        size = len(json.dumps(getattr(spec, section).args, separators=(",", ":")))
        if size > CATALOG_ARGS_MAX:
            problems.append(SpecProblem((section, "args"), f"{size} characters as JSON; at most {CATALOG_ARGS_MAX}"))

    p, t = spec.parallel, spec.train
    per_step = p.world_size * t.grad_accum_steps if p.ranks_known else 0
    if per_step and t.global_batch_size % per_step:
        problems.append(SpecProblem(
            ("train", "global_batch_size"),
            f"{t.global_batch_size} is not divisible by ranks x grad_accum_steps = "
            f"{p.world_size} x {t.grad_accum_steps} = {per_step}",
        ))
    problems += model_parallel_problems(spec)
    if not all(0.0 <= b < 1.0 for b in t.betas):
        problems.append(SpecProblem(("train", "betas"), "each beta must be in [0, 1)"))
    if t.precision == "fp16" and p.device == "cpu":
        problems.append(SpecProblem(("train", "precision"), "fp16 needs CUDA; use bf16 or fp32 on the CPU"))
    problems += _common_problems(spec, limits)

    if limits.data_dir is not None:
        for name in catalog.DATA_PATH_FIELDS:
            value = spec.data.args.get(name)
            if value is None:
                continue
            try:
                data_file(limits.data_dir, str(value))
            except (ValueError, FileNotFoundError) as exc:
                problems.append(SpecProblem(("data", "args", name), f"{value!r} {exc}"))
    return problems


def model_parallel_problems(spec: JobSpec) -> list[SpecProblem]:
    """Meshes that cannot be built: pipeline stages that do not divide the blocks or the ranks, heads not divisible
    by the tensor-parallel ranks, a batch that does not split into the micro-batches."""
    p, t = spec.parallel, spec.train
    problems: list[SpecProblem] = []
    pp = p.pipeline
    entry = catalog.MODELS.get(spec.model.name)  # plugins get neither kind of model parallelism
    if pp is not None and p.tensor > 1:
        problems.append(SpecProblem(("parallel", "tensor"), "pipeline and tensor parallelism together are not supported; use one"))
        return problems
    if pp is not None or p.tensor > 1:
        # Not wired into the stage/shard builders yet: refused rather than silently ignored.
        for name, value in (("precision", t.precision == "fp16"), ("compile", t.compile),
                            ("activation_checkpointing", t.activation_checkpointing)):
            if value:
                problems.append(SpecProblem(("train", name), f"{'fp16' if name == 'precision' else 'true'} is not supported "
                                                             "with pipeline or tensor parallelism"))
    if pp is not None:
        if entry is None or entry.pipeline_blocks is None:
            return [SpecProblem(("parallel", "pipeline"), f"pipeline parallelism supports {catalog.models_with('pipeline_blocks')}, "
                                                          f"not {spec.model.name!r}")]
        layers_field = entry.pipeline_blocks
        layers = entry.arg(spec.model.args, layers_field)
        chunks = pp.stages * (2 if pp.schedule == "interleaved_1f1b" else 1)
        if isinstance(layers, int) and layers % chunks:
            problems.append(SpecProblem(("parallel", "pipeline", "stages"),
                                        f"{chunks} pipeline chunks ({pp.stages} stages"
                                        f"{' x 2 for interleaved_1f1b' if chunks != pp.stages else ''}) do not divide "
                                        f"model.args.{layers_field} = {layers}"))
        if entry.pipeline_rules is not None:
            problems += [SpecProblem(loc, msg) for loc, msg in entry.pipeline_rules(spec.model.args)]
        if t.grad_accum_steps != 1:
            problems.append(SpecProblem(("train", "grad_accum_steps"),
                                        "must be 1 with a pipeline: its micro-batches (parallel.pipeline.microbatches) accumulate"))
        if pp.microbatches < pp.stages:
            problems.append(SpecProblem(("parallel", "pipeline", "microbatches"),
                                        f"{pp.microbatches} is fewer than the {pp.stages} stages"))
        elif pp.schedule == "interleaved_1f1b" and pp.microbatches % pp.stages:
            problems.append(SpecProblem(("parallel", "pipeline", "microbatches"),
                                        f"{pp.microbatches} is not a multiple of the {pp.stages} stages (interleaved_1f1b)"))
        if p.ranks_known:
            if p.world_size % pp.stages:
                problems.append(SpecProblem(("parallel", "pipeline", "stages"),
                                            f"{pp.stages} stages do not divide the world size {p.world_size}"))
            else:
                dp = p.world_size // pp.stages
                if t.global_batch_size % (dp * pp.microbatches):
                    problems.append(SpecProblem(("parallel", "pipeline", "microbatches"),
                                                f"global_batch_size {t.global_batch_size} is not divisible by data-parallel ranks "
                                                f"x microbatches = {dp} x {pp.microbatches}"))
    if p.tensor > 1:
        if entry is None or entry.tensor_heads is None:
            return problems + [SpecProblem(("parallel", "tensor"), f"tensor parallelism supports {catalog.models_with('tensor_heads')}, "
                                                                   f"not {spec.model.name!r}")]
        heads = entry.arg(spec.model.args, entry.tensor_heads)
        if isinstance(heads, int) and heads % p.tensor:
            problems.append(SpecProblem(("parallel", "tensor"), f"model.args.{entry.tensor_heads} = {heads} is not divisible by "
                                                                f"{p.tensor} ranks"))
        if p.ranks_known and p.world_size % p.tensor:
            problems.append(SpecProblem(("parallel", "tensor"), f"{p.tensor} does not divide the world size {p.world_size}"))
        elif p.ranks_known and p.world_size > p.tensor and p.strategy != "fsdp":
            problems.append(SpecProblem(("parallel", "strategy"),
                                        "tensor parallelism composes with fsdp over the remaining ranks; set strategy: fsdp"))
    return problems


def _common_problems(spec: JobBase, limits: SpecLimits) -> list[SpecProblem]:
    """Checks every kind of job gets: process counts within the host's limits, queue, labels, env and secrets."""
    problems: list[SpecProblem] = []
    p = spec.parallel
    if p.ranks_known and p.nproc_per_node > limits.max_nproc_per_node:
        problems.append(SpecProblem(
            ("parallel", "nproc_per_node"),
            f"{p.nproc_per_node} processes per node; this service allows at most {limits.max_nproc_per_node}",
        ))
    if p.nnodes > limits.max_nnodes:
        problems.append(SpecProblem(("parallel", "nnodes"), f"{p.nnodes} nodes; this service allows at most {limits.max_nnodes}"))
    if limits.queues is not None and spec.queue not in limits.queues:
        problems.append(SpecProblem(("queue",), f"unknown queue {spec.queue!r}; this service has: {', '.join(sorted(limits.queues))}"))

    for key in spec.labels:
        if not re.match(LABEL_KEY_PATTERN, key):
            problems.append(SpecProblem(("labels", key), "label keys are letters, digits, '.', '_', '/' and '-', at most 63"))
        elif len(spec.labels[key]) > 256:
            problems.append(SpecProblem(("labels", key), "label values are at most 256 characters"))
    problems += _variable_problems("env", spec.env, env_name_problem, ENV_TOTAL_MAX)
    problems += _variable_problems("secrets", spec.secret_values(), name_problem, SECRETS_TOTAL_MAX)
    if spec.secrets and not limits.secrets_allowed:
        problems.append(SpecProblem(("secrets",), "this service stores no secrets (its operator has not set TORCHYARD_SECRETS_KEY)"))
    for name in set(spec.env) & set(spec.secrets):
        problems.append(SpecProblem(("secrets", name), "also set in env; give each variable once"))
    return problems


def _variable_problems(section: str, variables: dict[str, str], rule: Any, total_max: int) -> list[SpecProblem]:
    # Messages never quote a value: for secrets that would send the credential back in the 422.
    problems: list[SpecProblem] = []
    for name, value in variables.items():
        why = rule(name)
        if why is not None:
            problems.append(SpecProblem((section, name), why))
        elif "\x00" in value:
            problems.append(SpecProblem((section, name), "value contains a NUL character"))
    total = sum(len(name) + len(value) for name, value in variables.items())
    if total > total_max:
        problems.append(SpecProblem((section,), f"{total} characters of names and values in all; at most {total_max}"))
    return problems


def _compatibility_problems(spec: JobSpec, model: catalog.CatalogEntry, data: catalog.CatalogEntry) -> list[SpecProblem]:
    """The model against the dataset, from what their catalog entries say; then the model's own rules."""
    problems: list[SpecProblem] = []
    data_task = data.arg(spec.data.args, data.task_arg) if data.task_arg else data.task
    if model.task != "any" and data_task != "any" and model.task != data_task:
        problems.append(SpecProblem(
            ("model", "name"), f"model {spec.model.name!r} trains on {model.task} data, dataset {spec.data.name!r} is {data_task}",
        ))
    if model.task == "any" and data_task == "lm" and model.input != "any":
        problems.append(SpecProblem(("model", "name"), f"model {spec.model.name!r} does not take token sequences; use gpt"))
    if data.image_arg is not None:
        image = spec.data.args.get(data.image_arg) is not None
        if model.input == "image" and not image:
            problems.append(SpecProblem(("data", "args", data.image_arg), f"model {spec.model.name!r} needs image inputs; "
                                                                          f"set {data.image_arg}"))
        if model.input == "vector" and image:
            problems.append(SpecProblem(("data", "args", data.image_arg), f"model {spec.model.name!r} takes vectors; "
                                                                          f"leave {data.image_arg} unset"))
    if model.rules is not None:
        problems += [SpecProblem(loc, msg) for loc, msg in model.rules(spec.model.args, spec.data.args)]
    return problems


# ---------------------------------------------------------------- script job checks


def _entrypoint_words(why: str, spec: ScriptJobSpec) -> str:
    """The root named as the user knows it: the directory they uploaded, or the service's own code root,
    with the way to send their directory when the entrypoint is not found there."""
    if spec.code:
        return why.replace("under the code root", "in the uploaded directory").replace("the code root", "the uploaded directory")
    why = why.replace("the code root", "the service's code root", 1)
    if why.startswith("no such"):
        why += ("; to run code from your own directory, send it with the job: `torchyard submit SPEC --workdir DIR`, "
                "or POST /v1/code and set `code`")
    return why


def script_problems(spec: ScriptJobSpec, limits: SpecLimits) -> list[SpecProblem]:
    """Reasons a script job cannot run: entrypoint not allowed or missing, args too long or with NUL bytes."""
    problems: list[SpecProblem] = []
    try:
        resolve_entrypoint(spec.entrypoint, limits.code_dir, limits.script_modules)
    except ValueError as exc:
        problems.append(SpecProblem(("entrypoint",), f"{spec.entrypoint!r}: {_entrypoint_words(str(exc), spec)}"))
    for i, arg in enumerate(spec.args):
        if "\x00" in arg:
            problems.append(SpecProblem(("args", i), "contains a NUL character"))
    total = sum(len(arg) for arg in spec.args)
    if total > ARGS_TOTAL_MAX:
        problems.append(SpecProblem(("args",), f"{total} characters in all; at most {ARGS_TOTAL_MAX}"))
    for i, line in enumerate(spec.requirements):
        if (why := requirement_problem(line)) is not None:
            problems.append(SpecProblem(("requirements", i), why))
    for i, arg in enumerate(spec.resume_args):
        if (why := template_problem(arg) or ("contains a NUL character" if "\x00" in arg else None)) is not None:
            problems.append(SpecProblem(("resume_args", i), why))
    for i, pattern in enumerate(spec.checkpoint.discover):
        if PurePath(pattern).is_absolute() or ".." in PurePath(pattern).parts or "\x00" in pattern:
            problems.append(SpecProblem(("checkpoint", "discover", i),
                                        f"{pattern!r} must be a relative glob inside the working directory (no '..')"))
    return problems
