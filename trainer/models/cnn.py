"""Small convolutional classifier with BatchNorm (SyncBatchNorm under data parallelism)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainer.data.base import DataInfo
from trainer.models.spec import ModelSpec


class ConvBlock(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, pool: bool):
        layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]
        if pool:
            layers.append(nn.MaxPool2d(2))
        super().__init__(*layers)


class CNN(nn.Module):
    def __init__(self, in_channels: int, image_size: int, num_classes: int, channels: int, blocks: int):
        super().__init__()
        convs, c_in, size = [], in_channels, image_size
        for i in range(blocks):
            c_out = channels * 2**i
            pool = size >= 2  # stop halving once the feature map is 1x1
            convs.append(ConvBlock(c_in, c_out, pool))
            c_in, size = c_out, size // 2 if pool else size
        self.features = nn.ModuleList(convs)
        self.head = nn.Linear(c_in, num_classes)

    def blocks(self) -> list[nn.Module]:
        return list(self.features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.features:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


def build_cnn(args: dict[str, Any], info: DataInfo) -> nn.Module:
    c, h, _ = info.input_shape
    return CNN(c, h, info.num_outputs, args["channels"], args["blocks"])


SPEC = ModelSpec(name="cnn", build=build_cnn)
