"""Seeded synthetic sets: the same seed gives the same data on every rank and every host.

Each set has a hidden "teacher" so the task is learnable (losses fall), which makes the training loop's
tests meaningful without downloading anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainer.data.base import DataInfo, DatasetSplits, TensorPairs, TokenChunks

# The synthetic language: each token's candidate successors, and the longest walk generated in one piece.
SUCCESSORS = 8
WALK_STEPS = 256


def _split(x: torch.Tensor, y: torch.Tensor, n_train: int) -> tuple[TensorPairs, TensorPairs | None]:
    ev = TensorPairs(x[n_train:], y[n_train:]) if len(x) > n_train else None
    return TensorPairs(x[:n_train], y[:n_train]), ev


def build_synthetic_classification(args: dict[str, Any], data_dir: Path | None = None) -> DatasetSplits:
    g = torch.Generator().manual_seed(args["seed"])
    n = args["samples"] + args["eval_samples"]
    if args["image_size"] is not None:
        shape: tuple[int, ...] = (args["channels"], args["image_size"], args["image_size"])
        # Smooth images (a low-resolution pattern upsampled) so convolutions have structure to find.
        low = torch.randn(n, args["channels"], 4, 4, generator=g)
        x = torch.nn.functional.interpolate(low, size=shape[1:], mode="bilinear", align_corners=False)
        x = x + 0.1 * torch.randn(x.shape, generator=g)
        feats = low.flatten(1)
    else:
        shape = (args["features"],)
        x = torch.randn(n, args["features"], generator=g)
        feats = x
    teacher = torch.randn(feats.shape[1], args["classes"], generator=g)
    logits = feats @ teacher / feats.shape[1] ** 0.5
    y = (logits + args["noise"] * torch.randn(logits.shape, generator=g)).argmax(dim=1)
    train, ev = _split(x.contiguous(), y, args["samples"])
    return DatasetSplits(train, ev, DataInfo("classification", shape, args["classes"]))


def build_synthetic_regression(args: dict[str, Any], data_dir: Path | None = None) -> DatasetSplits:
    g = torch.Generator().manual_seed(args["seed"])
    n = args["samples"] + args["eval_samples"]
    x = torch.randn(n, args["features"], generator=g)
    teacher = torch.randn(args["features"], args["targets"], generator=g) / args["features"] ** 0.5
    y = torch.tanh(x @ teacher) + args["noise"] * torch.randn(n, args["targets"], generator=g)
    train, ev = _split(x, y, args["samples"])
    return DatasetSplits(train, ev, DataInfo("regression", (args["features"],), args["targets"]))


def build_synthetic_lm(args: dict[str, Any], data_dir: Path | None = None) -> DatasetSplits:
    """Token streams from a random sparse Markov chain: each token has a few likely successors.

    The chain is kept as SUCCESSORS candidates per token (not a vocab x vocab matrix, which at GPT-2's vocabulary
    would be 10 GB), and the walks advance thousands of walkers a step, so a million tokens take a fraction of a second.
    """
    g = torch.Generator().manual_seed(args["seed"])
    vocab, seq_len = args["vocab_size"], args["seq_len"]
    k = min(vocab, SUCCESSORS)
    successors = torch.randint(vocab, (vocab, k), generator=g)
    cdf = torch.softmax(torch.randn(vocab, k, generator=g) * 2.0, dim=1).cumsum(dim=1)
    n_train, n_eval = args["samples"], args["eval_samples"]

    def stream(n_seq: int) -> torch.Tensor:
        length = n_seq * seq_len + 1
        # Many walks in parallel, at most WALK_STEPS long, so the Python loop stays short; then concatenated.
        walkers = max(256, -(-length // WALK_STEPS))
        steps = -(-length // walkers)
        cur = torch.randint(vocab, (walkers,), generator=g)
        draws = torch.rand(steps, walkers, 1, generator=g)
        out = torch.empty(walkers, steps, dtype=torch.long)
        for t in range(steps):
            out[:, t] = cur
            pick = torch.searchsorted(cdf[cur], draws[t]).clamp_(max=k - 1)
            cur = successors[cur, pick.squeeze(1)]
        return out.reshape(-1)[:length]

    train = TokenChunks(stream(n_train), seq_len)
    ev = TokenChunks(stream(n_eval), seq_len) if n_eval else None
    return DatasetSplits(train, ev, DataInfo("lm", (seq_len,), vocab))
