"""JobSpec: the one definition of a training job.

Imported by the API (validation at POST), the worker (what to launch) and the
trainer (what to train). It must stay importable without torch.

Validation happens in two layers:

* field bounds, enforced by pydantic when a spec is parsed (this module);
* rules that span fields or depend on the host (``spec_problems``, jobspec/rules.py), with the
  per-model ones on the catalog entries (jobspec/catalog.py) and path safety in jobspec/paths.py.
  Each problem names its field.

``secrets`` hold values as ``SecretStr``: any dump of a spec shows them masked,
and ``visible_dump`` (what is stored, returned and written to spec.json) leaves
them out altogether.

Two kinds of job share one base (name, parallel, retries, limits, queue, labels, env, secrets):
``kind: catalog`` (``JobSpec``, the default when ``kind`` is absent) trains a
catalog model on a catalog dataset; ``kind: script`` (``ScriptJobSpec``) runs the
user's own script from the code root under torchrun. ``AnySpec`` is the union,
``spec_from_dict`` parses it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    StrictBool,
    StringConstraints,
    Tag,
    TypeAdapter,
    ValidationError,
    WrapValidator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from jobspec.output_metrics import MAX_TEMPLATE_CHARS, MAX_TEMPLATES, template_problem
from jobspec.paths import resolve_entrypoint as resolve_entrypoint
from jobspec.requirements import MAX_REQUIREMENT_CHARS, MAX_REQUIREMENTS
from jobspec.rules import ARGS_TOTAL_MAX, SpecError, SpecLimits, spec_problems
from jobspec.rules import LABEL_KEY_PATTERN as LABEL_KEY_PATTERN
from jobspec.rules import SpecProblem as SpecProblem

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


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


class PipelineSpec(_Strict):
    stages: int = Field(2, ge=2, le=64, description="Ranks in one pipeline (pp); the blocks are split evenly between them.")
    microbatches: int = Field(4, ge=1, le=1024, description="Micro-batches each data-parallel rank's batch is cut into; "
                                                            "at least stages.")
    schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = Field(
        "1f1b", description="gpipe: all forwards then all backwards; 1f1b: one forward one backward (less activation "
                            "memory); interleaved_1f1b: two model chunks per rank (a smaller bubble).",
    )


class ParallelSpec(_Strict):
    strategy: Literal["ddp", "fsdp"] = Field("ddp", description="Data parallelism: DDP or FSDP2 (fully_shard).")
    nnodes: int = Field(1, ge=1, le=64, description="Workers (hosts or containers) the job spans.")
    nproc_per_node: Annotated[int, Field(ge=1, le=64)] | Literal["gpu"] = Field(
        1, description="Processes (ranks) per node; one per GPU on GPU hosts. 'gpu': one per GPU of the worker that runs it; "
                       "a number larger than that worker's GPUs fails the claim.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA with NCCL when there is a GPU, else CPU with gloo.")
    ddp: DDPOptions = Field(default_factory=DDPOptions)
    fsdp: FSDPOptions = Field(default_factory=FSDPOptions)
    pipeline: PipelineSpec | None = Field(None, description="Pipeline parallelism for gpt and mlp (torch.distributed.pipelining); "
                                                            "strategy applies over the remaining ranks (a dp x pp mesh).")
    tensor: int = Field(1, ge=1, le=64, description="Tensor-parallel ranks for gpt: attention heads and MLP split between "
                                                    "them; FSDP over the remaining ranks (a dp x tp mesh).")

    @property
    def ranks_known(self) -> bool:
        """False for nproc_per_node 'gpu' until a worker has placed the job (worker/devices.py)."""
        return self.nproc_per_node != "gpu"

    @property
    def world_size(self) -> int:
        if self.nproc_per_node == "gpu":
            raise ValueError("parallel.nproc_per_node is 'gpu': the world size is known once a worker places the job")
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
    compile: bool | None = Field(None, description="torch.compile the model's blocks and the loss. Unset: on for CUDA jobs without "
                                                   "pipeline or tensor parallelism, off on the CPU.")
    auto_micro_batch: bool = Field(
        False, description="An attempt that runs out of memory is retried with half the micro-batch and twice grad_accum_steps "
                           "(same global batch, same loss curve); the job's adjustments say so.",
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the model's initialisation, the shuffling order and dropout "
                                                          "(per rank); synthetic data has its own data.args.seed.")
    log_every_steps: int = Field(10, ge=1, le=1_000_000, description="Steps between train/* metric events.")


class EvalSpec(_Strict):
    every_steps: int | None = Field(None, ge=1, le=100_000_000, description="Evaluate every N steps; always at the end.")
    every_epochs: int | None = Field(None, ge=1, le=100_000, description="Evaluate after every N-th epoch (with or without every_steps).")
    max_batches: int | None = Field(None, ge=1, le=1_000_000, description="Cap on eval batches per evaluation.")


class CheckpointSpec(_Strict):
    every_steps: int | None = Field(None, ge=1, le=100_000_000, description="Save every N steps; always at the end.")
    every_epochs: int | None = Field(None, ge=1, le=100_000, description="Save after every N-th epoch (with or without every_steps).")
    keep_last: int = Field(3, ge=1, le=1000, description="Step checkpoints kept; older ones are deleted.")
    async_save: bool = Field(False, description="Save in the background so training is not blocked.")


ENV_VALUE_MAX = 4096
SECRET_VALUE_MAX = 8192

EnvValue = Annotated[str, StringConstraints(max_length=ENV_VALUE_MAX)]
SecretValue = Annotated[SecretStr, Field(max_length=SECRET_VALUE_MAX)]


class MlflowTracking(_Strict):
    experiment: str = Field("torchyard", min_length=1, max_length=256, pattern=r"^[^\x00-\x1f]+$",
                            description="MLflow experiment the job's run goes in; created when missing.")


class TrackingSpec(_Strict):
    mlflow: MlflowTracking | None = Field(
        None, description="Log params, metrics and the final weights to MLflow. Needs the operator's "
                          "TORCHYARD_MLFLOW_TRACKING_URI; with it set, every job is logged to the default experiment anyway.")


class ProfileSpec(_Strict):
    start_step: int = Field(..., ge=1, le=100_000_000, description="First optimizer step recorded (1-based).")
    steps: int = Field(3, ge=1, le=100, description="Steps recorded from start_step.")
    memory: StrictBool = Field(False, description="Also record tensor allocations (profile_memory) and shapes.")


_JOB_ID = re.compile(r"[0-9a-f]{1,64}")


def _job_id(value: str) -> str:
    if not _JOB_ID.fullmatch(value):
        raise PydanticCustomError("job_id", "'{value}' is not a job id (the hex id the API gave the job)", {"value": value})
    return value


class JobBase(_Strict):
    """What every kind of job has: identity, ranks, restarts and retries, limits, queue, labels, env and secrets."""

    kind: str  # narrowed to a Literal by each kind; declared here so it stays the first field
    name: str = Field(..., pattern=NAME_PATTERN, description="Human name; letters, digits, '.', '_' and '-'.")
    parallel: ParallelSpec = Field(default_factory=ParallelSpec)
    max_restarts: int = Field(0, ge=0, le=100, description="torchrun restarts of all ranks inside one attempt.")
    retries: int = Field(0, ge=0, le=100, description="Further whole-job attempts, each resuming from the latest checkpoint.")
    timeout_s: int = Field(86_400, ge=1, le=30 * 86_400, description="Wall-clock limit of one attempt.")
    stall_timeout_s: int | None = Field(None, ge=10, le=86_400, description="No new step for this long stops the attempt.")
    queue: str = Field("default", pattern=NAME_PATTERN, description="RQ queue the job waits in.")
    priority: int = Field(50, ge=0, le=100, description="Higher goes first and may preempt lower; at most the key's max_priority.")
    preemptible: StrictBool = Field(True, description="false: never stopped to make room for another job (the key must allow it).")
    labels: dict[str, str] = Field(default_factory=dict, max_length=32, description="Free-form labels for filtering.")
    env: dict[str, EnvValue] = Field(
        default_factory=dict, max_length=64,
        description="Extra environment for every rank, from an allow-list of names (docs/spec.md); shown in responses.",
    )
    secrets: dict[str, SecretValue] = Field(
        default_factory=dict, max_length=32,
        description="Credentials for every rank's environment (e.g. WANDB_API_KEY, HF_TOKEN), under the same name rules as env. "
                    "Stored encrypted, never returned: responses list their names only.",
    )
    depends_on: list[Annotated[str, AfterValidator(_job_id)]] = Field(
        default_factory=list, max_length=32,
        description="Job ids (of the submitting key's owner) that must succeed first; this job waits until they have, "
                    "and is cancelled (dependency_failed) if one fails or is cancelled.",
    )
    tracking: TrackingSpec = Field(default_factory=TrackingSpec,
                                   description="Where rank 0's metrics go besides torchyard (TensorBoard is always written).")

    def secret_values(self) -> dict[str, str]:
        """The secrets in clear, for the one place that stores them (encrypted)."""
        return {name: value.get_secret_value() for name, value in self.secrets.items()}

    def visible_dump(self) -> dict[str, Any]:
        """The spec as stored, returned and written to spec.json: everything but the secrets."""
        return self.model_dump(mode="json", exclude={"secrets"})


class JobSpec(JobBase):
    """A catalog training job: a model from the catalog trained on a dataset from the catalog."""

    kind: Literal["catalog"] = "catalog"
    model: ModelSpec
    data: DataSpec
    train: TrainSpec = Field(default_factory=TrainSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    profile: ProfileSpec | None = Field(None, description="torch.profiler trace of some steps on every rank, into "
                                                          "artifacts/profiler/rank{N}.json.gz.")


# ---------------------------------------------------------------- script jobs

CODE_PATTERN = r"^sha256:[0-9a-f]{64}$"

ScriptArg = Annotated[str, StringConstraints(max_length=4096)]
DiscoverGlob = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class ScriptCheckpointSpec(_Strict):
    discover: list[DiscoverGlob] = Field(
        default_factory=list, max_length=16,
        description="Globs relative to the working directory ('out/*.pt') naming checkpoints the script writes, besides "
                    "the Lightning, Hugging Face and Accelerate checkpoints found without them.",
    )


def _output_template(value: str) -> str:
    if (problem := template_problem(value)) is not None:
        raise PydanticCustomError("output_template", "{problem}", {"problem": problem})
    return value


OutputTemplate = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEMPLATE_CHARS), AfterValidator(_output_template)]


class ScriptMetricsSpec(_Strict):
    from_output: list[OutputTemplate] = Field(
        default_factory=list, max_length=MAX_TEMPLATES,
        description="Templates of lines the script prints on rank 0, naming their numbers: 'iter {step}: loss "
                    "{train/loss}, time {time_ms}ms'. '{step}' is the step (without it, a match is at the step printed "
                    "last, and the first template's matches are numbered in order), '{name}' a metric, '{_}' a number "
                    "not kept, a leading '^' the line's start; each match becomes metric points (docs/porting.md).",
    )


class ScriptJobSpec(JobBase):
    """The user's own training script (a .py file or a module under the code root: the job's uploaded ``code``
    bundle, else TORCHYARD_CODE_DIR; or an installed module the operator lists in TORCHYARD_SCRIPT_MODULES)
    run under torchrun, optionally in an environment with extra ``requirements``.

    ``parallel`` sets nnodes and nproc_per_node; strategy and its options are the script's own business.
    """

    kind: Literal["script"]
    entrypoint: str = Field(
        ..., min_length=1, max_length=1024,
        description="A .py file under the code root ('train/ddp.py'), a dotted module under it ('mypkg.train'), "
                    "or an installed module listed in TORCHYARD_SCRIPT_MODULES. The code root is the job's `code` "
                    "bundle when it has one, else TORCHYARD_CODE_DIR.",
    )
    args: list[ScriptArg] = Field(
        default_factory=list, max_length=256,
        description=f"Command-line arguments, one list item each; never passed through a shell. "
                    f"At most {ARGS_TOTAL_MAX} characters in all.",
    )
    code: str | None = Field(
        None, pattern=CODE_PATTERN,
        description="An uploaded code bundle ('sha256:<hex>', from POST /v1/code): the entrypoint resolves inside it "
                    "instead of TORCHYARD_CODE_DIR.",
    )
    requirements: list[Annotated[str, StringConstraints(max_length=MAX_REQUIREMENT_CHARS)]] = Field(
        default_factory=list, max_length=MAX_REQUIREMENTS,
        description="Python packages installed for this job ('tqdm==4.67.1'), into a cached environment layered over the worker's.",
    )
    resume_args: list[ScriptArg] = Field(
        default_factory=list, max_length=64,
        description="Arguments added after `args` only to an attempt that resumes, '{checkpoint}' standing for the latest "
                    "complete checkpoint found (absolute path): ['--ckpt_path', '{checkpoint}'].",
    )
    checkpoint: ScriptCheckpointSpec = Field(default_factory=ScriptCheckpointSpec,
                                             description="Where the script's own checkpoints are, beyond the frameworks' layouts.")
    metrics: ScriptMetricsSpec = Field(default_factory=ScriptMetricsSpec,
                                       description="Metrics the script only prints, read from its output.")


def _spec_kind(value: Any) -> str:
    # A spec without ``kind`` is a catalog job: every spec written before script jobs existed stays valid.
    if isinstance(value, dict):
        return value.get("kind", "catalog")
    return getattr(value, "kind", "catalog")


_KINDS: dict[str, type[JobBase]] = {"catalog": JobSpec, "script": ScriptJobSpec}


def _validate_kind(value: Any, handler: Any) -> Any:
    # The tagged union alone would put the tag in every error location ("catalog.train.lr"); validating
    # the chosen class directly keeps locations as the user wrote them ("train.lr"). The union stays
    # underneath for the JSON schema (oneOf) and for inputs that are not mappings.
    if isinstance(value, dict):
        kind = _spec_kind(value)
        cls = _KINDS.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise ValidationError.from_exception_data("JobSpec", [InitErrorDetails(
                type=PydanticCustomError("job_kind", "unknown job kind '{kind}'; use 'catalog' or 'script'", {"kind": str(kind)}),
                loc=("kind",), input=kind,
            )])
        return cls.model_validate(value)
    return handler(value)


AnySpec = Annotated[
    Annotated[JobSpec, Tag("catalog")] | Annotated[ScriptJobSpec, Tag("script")],
    Discriminator(_spec_kind),
    WrapValidator(_validate_kind),
]
SPEC_ADAPTER: TypeAdapter[JobSpec | ScriptJobSpec] = TypeAdapter(AnySpec)


def spec_from_dict(raw: dict[str, Any]) -> JobSpec | ScriptJobSpec:
    """A stored or submitted spec as its kind's class; raises pydantic.ValidationError. No host checks."""
    return SPEC_ADAPTER.validate_python(raw)


def parse_spec(raw: dict[str, Any] | str | bytes, limits: SpecLimits | None = None) -> JobSpec | ScriptJobSpec:
    """Parse and check a spec of any kind; raises pydantic.ValidationError or SpecError."""
    spec = SPEC_ADAPTER.validate_json(raw) if isinstance(raw, (str, bytes)) else SPEC_ADAPTER.validate_python(raw)
    problems = spec_problems(spec, limits)
    if problems:
        raise SpecError(problems)
    return spec


def load_spec_file(path: str | Path, limits: SpecLimits | None = None) -> JobSpec | ScriptJobSpec:
    """Read a spec from a .json or .yaml file, as the trainer does when started by hand."""
    text = Path(path).read_text(encoding="utf-8")
    if str(path).endswith((".yaml", ".yml")):
        import yaml

        return parse_spec(yaml.safe_load(text), limits)
    return parse_spec(json.loads(text), limits)
