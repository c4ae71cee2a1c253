"""Datasets by catalog name: seeded synthetic sets, tensor and text files under the data root, plugins.

Every builder returns a ``DatasetSplits``: a train set, an optional eval set and the ``DataInfo``
the model is built from (``DatasetBundle``, its earlier name, is the same class). In-memory sets
implement ``get_batch(indices)`` so the loader can index whole batches at once instead of collating
sample by sample.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from jobspec import catalog
from trainer.data.base import DataInfo, DatasetBundle, DatasetSplits, TensorPairs, TokenChunks
from trainer.data.files import build_tensor_file, build_text_file
from trainer.data.synthetic import build_synthetic_classification, build_synthetic_lm, build_synthetic_regression

log = logging.getLogger(__name__)

__all__ = ["DataInfo", "DatasetBundle", "DatasetSplits", "TensorPairs", "TokenChunks", "build_dataset"]

Builder = Callable[[dict[str, Any], Path | None], DatasetSplits]

BUILDERS: dict[str, Builder] = {
    "synthetic-classification": build_synthetic_classification,
    "synthetic-regression": build_synthetic_regression,
    "synthetic-lm": build_synthetic_lm,
    "tensor-file": build_tensor_file,
    "text-file": build_text_file,
}


def _plugin(name: str) -> Builder | None:
    for ep in entry_points(group=catalog.DATASET_ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.load()
    return None


def build_dataset(name: str, args: dict[str, Any], data_dir: Path | None) -> DatasetSplits:
    """Build a dataset by catalog (or plugin) name. Catalog args are validated and defaulted first.

    A plugin is a callable ``(args, data_dir) -> DatasetSplits`` (``DatasetBundle``, the earlier name, is the same
    class) registered under the entry-point group ``torchyard.datasets``; it checks its own arguments and must read
    only under data_dir.
    """
    if name in BUILDERS:
        full = catalog.validate_args(catalog.DATASETS[name], args)
        return BUILDERS[name](full, data_dir)
    builder = _plugin(name)
    if builder is None:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(catalog.known_datasets())}")
    splits = builder(dict(args), data_dir)
    if not isinstance(splits, DatasetSplits):
        raise TypeError(f"dataset plugin {name!r} returned {type(splits).__name__}, expected trainer.data.DatasetSplits")
    return splits
