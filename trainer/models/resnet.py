"""A small ResNet (basic blocks, CIFAR-style stem) for image classification."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.data.base import DataInfo
from trainer.models.spec import ModelSpec


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, in_channels: int, num_classes: int, width: int, blocks_per_stage: list[int]):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        layers, c_in = [], width
        for stage, n in enumerate(blocks_per_stage):
            c_out = width * 2**stage
            for i in range(n):
                layers.append(BasicBlock(c_in, c_out, 2 if stage > 0 and i == 0 else 1))
                c_in = c_out
        self.layers = nn.ModuleList(layers)
        self.head = nn.Linear(c_in, num_classes)

    def blocks(self) -> list[nn.Module]:
        return list(self.layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.layers:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


def build_resnet(args: dict[str, Any], info: DataInfo) -> nn.Module:
    return ResNet(info.input_shape[0], info.num_outputs, args["width"], list(args["blocks_per_stage"]))


SPEC = ModelSpec(name="resnet", build=build_resnet)
