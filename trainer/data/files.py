"""Tensor and text files under TORCHYARD_DATA_DIR. Nothing outside that root is ever opened."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from jobspec.paths import data_file
from trainer.data.base import DataInfo, DatasetSplits, TensorPairs, TokenChunks


def _under_root(data_dir: Path | None, relative: str, field: str) -> Path:
    if data_dir is None:
        raise ValueError(f"data.args.{field}: file datasets need TORCHYARD_DATA_DIR (the data root) to be set")
    try:
        return data_file(data_dir, relative)
    except ValueError as exc:
        raise ValueError(f"data.args.{field}: {relative!r} {exc}") from None
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"data.args.{field}: {relative!r} {exc}") from None


def _load_xy(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    name = path.name.lower()
    if name.endswith(".safetensors"):
        from safetensors.torch import load_file

        raw = load_file(str(path))
    elif name.endswith(".npz"):
        import numpy as np

        with np.load(path, allow_pickle=False) as z:  # no pickle: a data file must not run code
            raw = {k: torch.from_numpy(z[k]) for k in z.files}
    elif name.endswith((".pt", ".pth")):
        raw = torch.load(path, map_location="cpu", weights_only=True)  # weights_only: no arbitrary unpickling
    else:
        raise ValueError(f"{path.name}: tensor files are .pt, .npz or .safetensors")
    if not isinstance(raw, dict) or "x" not in raw or "y" not in raw:
        raise ValueError(f"{path.name}: expected a mapping with tensors 'x' and 'y'")
    return raw["x"], raw["y"]


def build_tensor_file(args: dict[str, Any], data_dir: Path | None) -> DatasetSplits:
    x, y = _load_xy(_under_root(data_dir, args["path"], "path"))
    x = x.float()
    task = args["task"]
    if task == "classification":
        y = y.long().reshape(-1)
        num_outputs = int(y.max().item()) + 1
    else:
        y = y.float()
        y = y.unsqueeze(1) if y.ndim == 1 else y
        num_outputs = y.shape[1]
    ev = None
    if args.get("eval_path"):
        ex, ey = _load_xy(_under_root(data_dir, args["eval_path"], "eval_path"))
        ey = ey.long().reshape(-1) if task == "classification" else ey.float().reshape(len(ey), -1)
        if task == "classification":
            num_outputs = max(num_outputs, int(ey.max().item()) + 1)
        ev = TensorPairs(ex.float(), ey)
    return DatasetSplits(TensorPairs(x, y), ev, DataInfo(task, tuple(x.shape[1:]), num_outputs))


def build_text_file(args: dict[str, Any], data_dir: Path | None) -> DatasetSplits:
    raw = _under_root(data_dir, args["path"], "path").read_bytes()
    raw.decode("utf-8")  # refuse non-UTF-8 input early with a clear error
    tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()  # bytes are tokens: vocab 256
    n_eval = int(len(tokens) * args["eval_fraction"])
    seq_len = args["seq_len"]
    train_tokens = tokens[: len(tokens) - n_eval]
    if len(train_tokens) < seq_len + 1:
        raise ValueError(f"data.args.path: {len(train_tokens)} training bytes, fewer than seq_len + 1 = {seq_len + 1}")
    ev = TokenChunks(tokens[len(tokens) - n_eval:], seq_len) if n_eval > seq_len else None
    return DatasetSplits(TokenChunks(train_tokens, seq_len), ev, DataInfo("lm", (seq_len,), 256))
