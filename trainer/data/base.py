"""Dataset containers shared by the builders."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch.utils.data import Dataset


@dataclass(frozen=True)
class DataInfo:
    """What a model needs to know about its data; saved in checkpoints so a model rebuilds without data."""

    task: Literal["classification", "regression", "lm"]
    input_shape: tuple[int, ...]  # one sample, e.g. (32,) or (3, 32, 32) or (seq_len,)
    num_outputs: int  # classes, regression targets or vocabulary size

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DataInfo:
        return cls(task=raw["task"], input_shape=tuple(raw["input_shape"]), num_outputs=int(raw["num_outputs"]))


class TensorPairs(Dataset):
    """Inputs and targets held in memory; batches are gathered with one index op."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} samples, y has {len(y)}")
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]

    def get_batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[idx], self.y[idx]


class TokenChunks(Dataset):
    """Language-model samples cut from one token stream: sample i is tokens[i*L : i*L + L + 1]."""

    def __init__(self, tokens: torch.Tensor, seq_len: int):
        self.tokens = tokens.long()
        self.seq_len = seq_len
        self._n = max(0, (len(tokens) - 1) // seq_len)
        self._offsets = torch.arange(seq_len + 1)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.tokens[i * self.seq_len: i * self.seq_len + self.seq_len + 1]
        return chunk[:-1], chunk[1:]

    def get_batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.tokens[idx[:, None] * self.seq_len + self._offsets]
        return chunk[:, :-1], chunk[:, 1:]


@dataclass
class DatasetSplits:
    """What a dataset builder returns: the train split, the eval split if any, and what the model is built from."""

    train: Dataset
    eval: Dataset | None
    info: DataInfo


# The plugin API's earlier name, kept so plugins written against it still work; "bundle" is the uploaded code's word.
DatasetBundle = DatasetSplits
