"""Multi-layer perceptron for vector inputs (classification or regression)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from trainer.data.base import DataInfo
from trainer.models.spec import ModelSpec, PipelineLayout


class MLP(nn.Module):
    def __init__(self, in_features: int, out_features: int, hidden: int, layers: int, dropout: float):
        super().__init__()
        widths = [in_features] + [hidden] * layers
        # A ModuleDict keeps a layer's name ("hidden.3") when a pipeline stage drops the others.
        self.hidden = nn.ModuleDict({
            str(i): nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Dropout(dropout))
            for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True))
        })
        self.head: nn.Linear | None = nn.Linear(hidden, out_features)

    def blocks(self) -> list[nn.Module]:
        return list(self.hidden.values())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for layer in self.hidden.values():
            x = layer(x)
        return self.head(x) if self.head is not None else x  # None: a pipeline stage before the last


def build_mlp(args: dict[str, Any], info: DataInfo) -> nn.Module:
    return MLP(math.prod(info.input_shape), info.num_outputs, args["hidden"], args["layers"], args["dropout"])


SPEC = ModelSpec(name="mlp", build=build_mlp,
                 pipeline=PipelineLayout(blocks="hidden", first=(), last=("head",), activation=lambda a, x: (x[0], a["hidden"])))
