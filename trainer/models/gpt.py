"""A decoder-only language model in the nanoGPT shape (learned positions, pre-norm, optionally tied embeddings).

Built to be split (trainer/model_parallel/): attention has separate q, k and v projections, so tensor
parallelism shards each by heads column-wise and the output projection row-wise, and computes with
however many heads are local (``-1`` in the reshape); the blocks live in a ModuleDict, so a pipeline
stage that drops some keeps the others' names ("h.3...") and with them its checkpoint names; and a stage
without the embeddings or the head has them set to None and passes activations straight through.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.data.base import DataInfo
from trainer.models.spec import ModelSpec, PipelineLayout


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, bias: bool, dropout: float):
        super().__init__()
        self.head_dim, self.dropout = dim // heads, dropout
        self.q = nn.Linear(dim, dim, bias=bias)
        self.k = nn.Linear(dim, dim, bias=bias)
        self.v = nn.Linear(dim, dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: all of them, or this rank's share under tensor parallelism.
        q, k, v = (m(x).view(b, t, -1, self.head_dim).transpose(1, 2) for m in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool, dropout: float):
        super().__init__()
        self.fc = nn.Linear(dim, hidden, bias=bias)
        self.proj = nn.Linear(hidden, dim, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, bias: bool, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, bias=bias)
        self.attn = CausalSelfAttention(dim, heads, bias, dropout)
        self.ln2 = nn.LayerNorm(dim, bias=bias)
        self.mlp = FeedForward(dim, 4 * dim, bias, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int, dropout: float, bias: bool,
                 tie_embeddings: bool = True):
        super().__init__()
        self.block_size = block_size
        self.wte: nn.Embedding | None = nn.Embedding(vocab_size, n_embd)
        self.wpe: nn.Embedding | None = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleDict({str(i): Block(n_embd, n_head, bias, dropout) for i in range(n_layer)})
        self.ln_f: nn.LayerNorm | None = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head: nn.Linear | None = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.proj.weight")):
                # Residual projections scaled by depth (GPT-2) so the residual stream does not grow with layers.
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def blocks(self) -> list[nn.Module]:
        return list(self.h.values())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.wte is not None and self.wpe is not None:  # the first pipeline stage (or the whole model) embeds
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.drop(self.wte(x) + self.wpe(pos))
        for block in self.h.values():
            x = block(x)
        if self.ln_f is not None:
            x = self.ln_f(x)
        return self.lm_head(x) if self.lm_head is not None else x


def build_gpt(args: dict[str, Any], info: DataInfo) -> nn.Module:
    return GPT(info.num_outputs, args["block_size"], args["n_layer"], args["n_head"], args["n_embd"], args["dropout"], args["bias"],
               args["tie_embeddings"])


def flops_per_sample(model: nn.Module, args: dict[str, Any], info: DataInfo) -> float:
    """Training FLOPs per sequence: 6N plus attention's 12 x layers x width x seq per token (the PaLM appendix)."""
    n_params = sum(p.numel() for p in model.parameters())
    seq = info.input_shape[0]
    return (6 * n_params + 12 * args["n_layer"] * args["n_embd"] * seq) * seq


SPEC = ModelSpec(
    name="gpt",
    build=build_gpt,
    pipeline=PipelineLayout(blocks="h", first=("wte", "wpe"), last=("ln_f", "lm_head"), activation=lambda a, x: (x[0], x[1], a["n_embd"])),
    # q, k, v and the MLP's first layer split by columns (each rank its heads, its slice of the hidden width), the
    # attention and MLP output projections by rows (partial sums all-reduced): two all-reduces a block each way.
    tensor_plan={"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise", "attn.proj": "rowwise",
                 "mlp.fc": "colwise", "mlp.proj": "rowwise"},
    flops_per_sample=flops_per_sample,
)
