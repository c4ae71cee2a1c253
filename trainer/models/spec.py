"""What the trainer knows of one catalog model, in one place (as torchtitan's ModelSpec): how to build it, how a
pipeline cuts it, how tensor parallelism shards its blocks, and its training FLOPs for MFU.

The model's arguments and the rules between them and the data stay in ``jobspec.catalog`` (the torch-free contract
the API checks specs with); everything the ranks need of the model lives beside its code, on its ``SPEC``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

from trainer.data.base import DataInfo

Builder = Callable[[dict[str, Any], DataInfo], nn.Module]


@dataclass(frozen=True)
class PipelineLayout:
    """How a pipeline cuts the model: its blocks sit in the ModuleDict ``blocks`` (stages keep their names), ``first``
    are the attributes only the first stage keeps (the inputs' side), ``last`` those only the last keeps."""

    blocks: str
    first: tuple[str, ...]
    last: tuple[str, ...]
    # The shape of the activation passed between stages, from the model's (defaulted) arguments and the input's shape.
    activation: Callable[[dict[str, Any], tuple[int, ...]], tuple[int, ...]]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Builder
    pipeline: PipelineLayout | None = None
    # Per block: submodule name -> how tensor parallelism splits it (Megatron style); None: not supported.
    tensor_plan: Mapping[str, Literal["colwise", "rowwise"]] | None = None
    # Training FLOPs per sample, from the built model, its (defaulted) arguments and the data; None: no MFU.
    flops_per_sample: Callable[[nn.Module, dict[str, Any], DataInfo], float] | None = None
