"""A tiny Vision Transformer: patch embedding, class token, pre-norm blocks."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.data.base import DataInfo
from trainer.models.spec import ModelSpec


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, causal: bool = False, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        self.heads, self.causal, self.dropout = heads, causal, dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        # SDPA picks flash/memory-efficient kernels on GPUs.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, causal: bool = False, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, bias=bias)
        self.attn = Attention(dim, heads, causal, bias, dropout)
        self.ln2 = nn.LayerNorm(dim, bias=bias)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden, bias=bias), nn.GELU(), nn.Linear(hidden, dim, bias=bias), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ViT(nn.Module):
    def __init__(self, in_channels: int, image_size: int, num_classes: int, patch_size: int, dim: int, depth: int, heads: int,
                 mlp_ratio: float):
        super().__init__()
        n_patches = (image_size // patch_size) ** 2
        self.patch = nn.Conv2d(in_channels, dim, patch_size, stride=patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n_patches + 1, dim) * 0.02)
        self.layers = nn.ModuleList(Block(dim, heads, int(dim * mlp_ratio)) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def blocks(self) -> list[nn.Module]:
        return list(self.layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], dim=1) + self.pos
        for block in self.layers:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def build_vit(args: dict[str, Any], info: DataInfo) -> nn.Module:
    c, h, _ = info.input_shape
    return ViT(c, h, info.num_outputs, args["patch_size"], args["dim"], args["depth"], args["heads"], args["mlp_ratio"])


SPEC = ModelSpec(name="vit", build=build_vit)
