"""Models by catalog name. Models are plain nn.Modules: they never import torch.distributed.

A model may define ``blocks() -> list[nn.Module]``: the repeated units that FSDP shards one by one
and that activation checkpointing recomputes. Plugins register a callable
``(args: dict, info: DataInfo) -> nn.Module`` under the entry-point group ``torchyard.models``.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from torch import nn

from jobspec import catalog
from trainer.data.base import DataInfo
from trainer.models.spec import ModelSpec

_MODULES = {"mlp": "trainer.models.mlp", "cnn": "trainer.models.cnn", "resnet": "trainer.models.resnet",
            "vit": "trainer.models.vit", "gpt": "trainer.models.gpt"}


def model_spec(name: str) -> ModelSpec | None:
    """The catalog model's ``SPEC`` (imported on demand, so a job pays only for the model it trains); None for a plugin."""
    module = _MODULES.get(name)
    return importlib.import_module(module).SPEC if module else None


def full_args(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A catalog model's arguments with the catalog's defaults filled in; a plugin's as given."""
    return catalog.validate_args(catalog.MODELS[name], args) if name in catalog.MODELS else dict(args)


def build_model(name: str, args: dict[str, Any], info: DataInfo) -> nn.Module:
    """Build a catalog (or plugin) model for data described by ``info``."""
    spec = model_spec(name)
    if spec is not None:
        return spec.build(full_args(name, args), info)
    for ep in entry_points(group=catalog.MODEL_ENTRY_POINT_GROUP):
        if ep.name == name:
            model = ep.load()(dict(args), info)
            if not isinstance(model, nn.Module):
                raise TypeError(f"model plugin {name!r} returned {type(model).__name__}, expected nn.Module")
            return model
    raise ValueError(f"unknown model {name!r}; known: {', '.join(catalog.known_models())}")


def model_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated units; for models without ``blocks()``, its direct children with parameters."""
    blocks = getattr(model, "blocks", None)
    if callable(blocks):
        return list(blocks())
    return [m for m in model.children() if any(True for _ in m.parameters())]
