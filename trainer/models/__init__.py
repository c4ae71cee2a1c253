"""Models by catalog name. Models are plain nn.Modules: they never import torch.distributed.

A model may define ``blocks() -> list[nn.Module]``: the repeated units that FSDP shards one by one
and that activation checkpointing recomputes. Plugins register a callable
``(args: dict, info: DataInfo) -> nn.Module`` under the entry-point group ``torchyard.models``.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from torch import nn

from trainer import catalog
from trainer.data.base import DataInfo
from trainer.models.mlp import build_mlp

Builder = Callable[[dict[str, Any], DataInfo], nn.Module]


def _builders() -> dict[str, Builder]:
    # Imported lazily so a job only pays for the model it trains.
    from trainer.models.cnn import build_cnn
    from trainer.models.gpt import build_gpt
    from trainer.models.resnet import build_resnet
    from trainer.models.vit import build_vit

    return {"mlp": build_mlp, "cnn": build_cnn, "resnet": build_resnet, "vit": build_vit, "gpt": build_gpt}


def build_model(name: str, args: dict[str, Any], info: DataInfo) -> nn.Module:
    """Build a catalog (or plugin) model for data described by ``info``."""
    if name in catalog.MODELS:
        full = catalog.validate_args(catalog.MODELS[name], args)
        return _builders()[name](full, info)
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
