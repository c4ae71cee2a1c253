"""What a sweep is: a base job spec, a search space over its fields, a method, the metric to rank trials by.

Pure values (pydantic, no I/O). A parameter's path is a dotted path into the job spec (``train.lr``,
``model.args.hidden``) or, for a script job, ``args.<flag>``: the value after that flag in ``args``
(``args.--lr``), appended as ``<flag> <value>`` when the base spec's args lack the flag.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

# A path: dotted spec field names, or args.<flag> for a script's command line.
PATH_PATTERN = r"^(args\.[^\s]{1,64}|[A-Za-z_][A-Za-z0-9_]{0,63}(\.[A-Za-z0-9_][A-Za-z0-9_-]{0,63}){0,7})$"
# Fields a sweep must not vary: what a trial is (its kind, its name and labels the sweep sets), where it queues.
FIXED_ROOTS = frozenset({"kind", "name", "labels", "queue", "secrets", "code"})
MAX_GRID = 10_000


def _refuse(field: tuple[str, ...], message: str) -> ValidationError:
    """A validation error located at ``field`` (a model-level check would otherwise name no field)."""
    return ValidationError.from_exception_data("SweepSpec", [InitErrorDetails(
        type=PydanticCustomError("sweep", message), loc=field, input=None)])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Choice(_Strict):
    type: Literal["choice"]
    values: list[Any] = Field(..., min_length=1, max_length=1000, description="The values tried, in this order for grid.")


class Uniform(_Strict):
    type: Literal["uniform", "loguniform"]
    low: float
    high: float

    @model_validator(mode="after")
    def _bounds(self) -> Uniform:
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.low >= self.high:
            raise ValueError("low must be finite and below high")
        if self.type == "loguniform" and self.low <= 0:
            raise ValueError("loguniform needs low > 0")
        return self


class IntRange(_Strict):
    type: Literal["int"]
    low: int
    high: int = Field(..., description="Inclusive.")
    step: int = Field(1, ge=1, description="Grid spacing; random draws land on it too.")

    @model_validator(mode="after")
    def _bounds(self) -> IntRange:
        if self.low > self.high:
            raise ValueError("low must not exceed high")
        return self


Param = Annotated[Choice | Uniform | IntRange, Field(discriminator="type")]


class AshaSpec(_Strict):
    resource: Literal["steps", "epochs"] = Field("steps", description="What a rung counts: optimizer steps or epochs.")
    min_resource: int = Field(..., ge=1, le=10_000_000, description="Resource of the first rung.")
    reduction_factor: int = Field(3, ge=2, le=16, description="eta: rung k is min_resource*eta^k; the top 1/eta go on.")
    rungs: int = Field(3, ge=1, le=10, description="Rungs, the last being the resource every surviving trial trains to.")
    brackets: int = Field(1, ge=1, le=10, description="Asynchronous Hyperband: bracket s starts at rung s; trials "
                                                       "take turns by number. At most rungs; 1 is plain ASHA.")
    sampler: Literal["random", "grid"] = Field("random", description="How trial parameters are drawn.")

    def resource_at(self, rung: int) -> int:
        return self.min_resource * self.reduction_factor ** rung

    @property
    def max_resource(self) -> int:
        return self.resource_at(self.rungs - 1)


class SweepSpec(_Strict):
    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$", description="Human name of the sweep.")
    spec: dict[str, Any] = Field(..., description="The base job spec every trial starts from (as POST /v1/jobs takes).")
    space: dict[Annotated[str, Field(pattern=PATH_PATTERN)], Param] = Field(..., min_length=1, max_length=32)
    method: Literal["grid", "random", "asha"]
    metric: str = Field(..., min_length=1, max_length=128, description="Metric name trials report, e.g. eval/loss.")
    mode: Literal["min", "max"] = "min"
    max_trials: int | None = Field(None, ge=1, le=1000, description="Trials in all; grid: default the whole grid.")
    max_concurrent_trials: int = Field(4, ge=1, le=256, description="Trials queued or running at once.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of random draws: the same seed draws the same trials.")
    asha: AshaSpec | None = Field(None, description="Required by method asha.")

    @model_validator(mode="after")
    def _method(self) -> SweepSpec:
        for path in self.space:
            if path.split(".")[0] in FIXED_ROOTS:
                raise _refuse(("space", path), "kind, name, labels, queue, secrets and code are fixed: they cannot be swept")
        if self.method == "asha" and self.asha is None:
            raise _refuse(("asha",), "method asha needs asha.min_resource (and optionally reduction_factor, rungs)")
        if self.method != "asha" and self.asha is not None:
            raise _refuse(("asha",), "only method asha takes asha settings")
        if self.asha is not None and self.asha.brackets > self.asha.rungs:
            raise _refuse(("asha", "brackets"), f"at most asha.rungs ({self.asha.rungs}) brackets: bracket s starts at rung s")
        if self.grid_sampled:
            for path, param in self.space.items():
                if isinstance(param, Uniform):
                    raise _refuse(("space", path), "grid needs choice or int parameters; this one is continuous")
            if grid_size(self.space) > MAX_GRID:
                raise _refuse(("space",), f"the grid has {grid_size(self.space)} points, more than {MAX_GRID}")
        elif self.max_trials is None:
            raise _refuse(("max_trials",), "random and asha sweeps need max_trials")
        return self

    @property
    def grid_sampled(self) -> bool:
        return self.method == "grid" or (self.asha is not None and self.asha.sampler == "grid")

    @property
    def trial_count(self) -> int:
        if self.grid_sampled:
            size = grid_size(self.space)
            return min(size, self.max_trials) if self.max_trials else size
        assert self.max_trials is not None
        return self.max_trials


def grid_size(space: dict[str, Any]) -> int:
    size = 1
    for param in space.values():
        size *= len(param.values) if isinstance(param, Choice) else (param.high - param.low) // param.step + 1
    return size


def set_path(spec: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``spec`` with ``path`` set to ``value`` (missing mappings on the way are created)."""
    out = copy.deepcopy(spec)
    if path.startswith("args."):
        flag = path[len("args."):]
        args = [str(a) for a in out.get("args") or []]
        if flag in args and args.index(flag) + 1 < len(args):
            args[args.index(flag) + 1] = _arg(value)
        else:
            args += [flag, _arg(value)]
        out["args"] = args
        return out
    node = out
    parts = path.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value
    return out


def _arg(value: Any) -> str:
    # Floats as Python writes them shortest (1e-05, 0.3): what argparse's float() reads back exactly.
    return repr(value) if isinstance(value, float) else str(value)


def trial_spec(sweep: SweepSpec, params: dict[str, Any], sweep_id: str, number: int) -> dict[str, Any]:
    """The job spec of trial ``number``: the base spec, its parameters, the sweep's labels, and for ASHA the
    resource of the last rung (a promoted trial simply continues) and an evaluation at every rung."""
    spec = copy.deepcopy(sweep.spec)
    for path, value in params.items():
        spec = set_path(spec, path, value)
    name = re.sub(r"[^A-Za-z0-9._-]", "-", f"{sweep.name}-t{number}")[:64]
    spec["name"] = name
    spec["labels"] = {**(spec.get("labels") or {}), "torchyard/sweep": sweep_id, "torchyard/trial": str(number)}
    if sweep.asha is not None and spec.get("kind", "catalog") == "catalog":
        train = spec.setdefault("train", {})
        evaluation = spec.setdefault("eval", {})
        if sweep.asha.resource == "steps":
            train["max_steps"] = sweep.asha.max_resource
            if sweep.metric.startswith("eval/") and not evaluation.get("every_steps"):
                evaluation["every_steps"] = sweep.asha.min_resource
        else:
            train["epochs"] = sweep.asha.max_resource
            if sweep.metric.startswith("eval/") and not evaluation.get("every_epochs"):
                evaluation["every_epochs"] = 1
    return spec


def better(mode: str, a: float, b: float) -> bool:
    """Whether ``a`` beats ``b`` under ``mode``."""
    return a < b if mode == "min" else a > b


def rank_key(mode: str, value: float | None) -> float:
    """Sort key, best first; a trial with no value (or NaN) sorts last."""
    if value is None or math.isnan(value):
        return math.inf
    return value if mode == "min" else -value
