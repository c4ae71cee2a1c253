"""The catalog of models and datasets a spec may name, as argument schemas.

This module must stay importable without torch: the API validates specs with it.
The torch-side builders live in ``trainer.models`` and ``trainer.data`` and are
looked up by the same names. Plugins add names through the entry-point groups
``torchyard.models`` and ``torchyard.datasets``; their arguments are checked by
the plugin itself when the trainer builds them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MODEL_ENTRY_POINT_GROUP = "torchyard.models"
DATASET_ENTRY_POINT_GROUP = "torchyard.datasets"

Task = Literal["classification", "regression", "lm", "any"]
# A reason a spec cannot run: where (from the spec's root) and why. jobspec/spec.py makes SpecProblems of them.
Problem = tuple[tuple[str | int, ...], str]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- models


class MLPArgs(_Args):
    hidden: int = Field(256, ge=1, le=65536, description="Width of each hidden layer.")
    layers: int = Field(2, ge=1, le=64, description="Number of hidden layers.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout after each hidden layer.")


class CNNArgs(_Args):
    channels: int = Field(32, ge=1, le=1024, description="Channels of the first conv block; doubled per block.")
    blocks: int = Field(2, ge=1, le=8, description="Conv + BatchNorm + ReLU + pool blocks.")


class ResNetArgs(_Args):
    width: int = Field(16, ge=1, le=512, description="Channels of the first stage; doubled per stage.")
    blocks_per_stage: list[Annotated[int, Field(ge=1, le=64)]] = Field(
        default_factory=lambda: [1, 1, 1], min_length=1, max_length=6,
        description="Residual blocks in each stage.",
    )


class ViTArgs(_Args):
    patch_size: int = Field(4, ge=1, le=64, description="Square patch side in pixels; must divide the image side.")
    dim: int = Field(64, ge=8, le=4096, description="Embedding width; divisible by heads.")
    depth: int = Field(2, ge=1, le=48, description="Transformer blocks.")
    heads: int = Field(4, ge=1, le=64, description="Attention heads.")
    mlp_ratio: float = Field(2.0, gt=0.0, le=16.0, description="MLP width over embedding width.")


class GPTArgs(_Args):
    n_layer: int = Field(2, ge=1, le=96, description="Transformer blocks.")
    n_head: int = Field(4, ge=1, le=128, description="Attention heads.")
    n_embd: int = Field(128, ge=8, le=16384, description="Embedding width; divisible by n_head.")
    block_size: int = Field(64, ge=2, le=32768, description="Context length; the data's seq_len must not exceed it.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    bias: bool = Field(True, description="Bias in linear layers and LayerNorms.")
    tie_embeddings: bool = Field(True, description="The output head shares the token embedding's weight (GPT-2); "
                                                   "false for pipeline parallelism, whose first and last stages are apart.")


def _default(schema: type[BaseModel], args: dict[str, Any], name: str) -> Any:
    return args.get(name, schema.model_fields[name].default)


def _gpt_rules(args: dict[str, Any], data_args: dict[str, Any]) -> list[Problem]:
    problems: list[Problem] = []
    block, seq = _default(GPTArgs, args, "block_size"), data_args.get("seq_len", 64)
    if isinstance(block, int) and isinstance(seq, int) and seq > block:
        problems.append((("data", "args", "seq_len"), f"{seq} exceeds the model's block_size {block}"))
    n_embd, n_head = _default(GPTArgs, args, "n_embd"), _default(GPTArgs, args, "n_head")
    if isinstance(n_embd, int) and isinstance(n_head, int) and n_head and n_embd % n_head:
        problems.append((("model", "args", "n_embd"), f"{n_embd} is not divisible by n_head {n_head}"))
    return problems


def _gpt_pipeline_rules(args: dict[str, Any]) -> list[Problem]:
    if _default(GPTArgs, args, "tie_embeddings"):
        return [(("model", "args", "tie_embeddings"),
                 "must be false with a pipeline: the embedding and the head live on different stages")]
    return []


def _vit_rules(args: dict[str, Any], data_args: dict[str, Any]) -> list[Problem]:
    problems: list[Problem] = []
    dim, heads = _default(ViTArgs, args, "dim"), _default(ViTArgs, args, "heads")
    if isinstance(dim, int) and isinstance(heads, int) and heads and dim % heads:
        problems.append((("model", "args", "dim"), f"{dim} is not divisible by heads {heads}"))
    patch, size = _default(ViTArgs, args, "patch_size"), data_args.get("image_size")
    if isinstance(size, int) and isinstance(patch, int) and patch and size % patch:
        problems.append((("data", "args", "image_size"), f"{size} is not divisible by the model's patch_size {patch}"))
    return problems


class CatalogEntry(BaseModel):
    """A catalog name: its argument schema, the task it serves, and what only it needs (one place per model)."""

    model_config = ConfigDict(frozen=True)

    args: type[BaseModel] | None  # None: a plugin that checks its own arguments
    task: Task
    input: Literal["vector", "image", "tokens", "any"] = "any"
    # Models: rules between the model's own arguments and the dataset's (model args, data args).
    rules: Callable[[dict[str, Any], dict[str, Any]], list[Problem]] | None = None
    # Models: the argument counting the blocks a pipeline splits between its stages; None: no pipeline parallelism.
    pipeline_blocks: str | None = None
    # Models: what a pipeline further needs of the arguments.
    pipeline_rules: Callable[[dict[str, Any]], list[Problem]] | None = None
    # Models: the argument tensor parallelism splits between its ranks; None: no tensor parallelism.
    tensor_heads: str | None = None
    # Datasets: the argument naming the task, where the user says it.
    task_arg: str | None = None
    # Datasets: the argument that, when set, makes the samples images.
    image_arg: str | None = None

    def arg(self, args: dict[str, Any], name: str) -> Any:
        """``args[name]``, else the schema's default."""
        assert self.args is not None
        return _default(self.args, args, name)


MODELS: dict[str, CatalogEntry] = {
    "mlp": CatalogEntry(args=MLPArgs, task="any", input="vector", pipeline_blocks="layers"),
    "cnn": CatalogEntry(args=CNNArgs, task="classification", input="image"),
    "resnet": CatalogEntry(args=ResNetArgs, task="classification", input="image"),
    "vit": CatalogEntry(args=ViTArgs, task="classification", input="image", rules=_vit_rules),
    "gpt": CatalogEntry(args=GPTArgs, task="lm", input="tokens", rules=_gpt_rules, pipeline_blocks="n_layer",
                        pipeline_rules=_gpt_pipeline_rules, tensor_heads="n_head"),
}


def models_with(feature: str) -> str:
    """The catalog's models that have ``feature`` set, as a message names them ("gpt and mlp")."""
    return " and ".join(sorted(name for name, entry in MODELS.items() if getattr(entry, feature) is not None))


# ---------------------------------------------------------------- datasets


class SyntheticClassificationArgs(_Args):
    samples: int = Field(8192, ge=16, le=10_000_000, description="Training samples.")
    eval_samples: int = Field(1024, ge=0, le=1_000_000, description="Held-out samples for eval/*.")
    features: int = Field(32, ge=1, le=65536, description="Input width (vector inputs).")
    classes: int = Field(10, ge=2, le=100_000, description="Number of classes.")
    image_size: int | None = Field(
        None, ge=4, le=512,
        description="If set, samples are images of shape (channels, image_size, image_size) instead of vectors.",
    )
    channels: int = Field(3, ge=1, le=16, description="Image channels when image_size is set.")
    noise: float = Field(0.1, ge=0.0, le=10.0, description="Label noise scale.")
    seed: int = Field(1234, ge=0, le=2**31 - 1, description="Seed of the data, independent of train.seed.")


class SyntheticRegressionArgs(_Args):
    samples: int = Field(8192, ge=16, le=10_000_000)
    eval_samples: int = Field(1024, ge=0, le=1_000_000)
    features: int = Field(32, ge=1, le=65536)
    targets: int = Field(1, ge=1, le=4096)
    noise: float = Field(0.1, ge=0.0, le=10.0)
    seed: int = Field(1234, ge=0, le=2**31 - 1)


class SyntheticLMArgs(_Args):
    samples: int = Field(4096, ge=16, le=10_000_000, description="Training sequences.")
    eval_samples: int = Field(256, ge=0, le=1_000_000)
    vocab_size: int = Field(256, ge=2, le=1_000_000)
    seq_len: int = Field(64, ge=2, le=32768)
    seed: int = Field(1234, ge=0, le=2**31 - 1)


class TensorFileArgs(_Args):
    path: str = Field(
        ..., min_length=1, max_length=4096,
        description="File under TORCHYARD_DATA_DIR (.pt, .npz or .safetensors) holding tensors 'x' and 'y'.",
    )
    eval_path: str | None = Field(None, max_length=4096, description="Optional held-out file of the same shape.")
    task: Literal["classification", "regression"] = "classification"


class TextFileArgs(_Args):
    path: str = Field(..., min_length=1, max_length=4096, description="UTF-8 text file under TORCHYARD_DATA_DIR.")
    seq_len: int = Field(64, ge=2, le=32768, description="Tokens per training sequence (bytes are tokens).")
    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0, description="Tail of the file held out for eval/*.")


DATASETS: dict[str, CatalogEntry] = {
    "synthetic-classification": CatalogEntry(args=SyntheticClassificationArgs, task="classification", image_arg="image_size"),
    "synthetic-regression": CatalogEntry(args=SyntheticRegressionArgs, task="regression", input="vector"),
    "synthetic-lm": CatalogEntry(args=SyntheticLMArgs, task="lm", input="tokens"),
    "tensor-file": CatalogEntry(args=TensorFileArgs, task="any", task_arg="task"),
    "text-file": CatalogEntry(args=TextFileArgs, task="lm", input="tokens"),
}

# Dataset arguments that name files under the data root; checked before a job runs.
DATA_PATH_FIELDS = ("path", "eval_path")


@lru_cache(maxsize=1)
def _plugin_names(group: str) -> frozenset[str]:
    return frozenset(ep.name for ep in entry_points(group=group))


def model_entry(name: str) -> CatalogEntry | None:
    """The catalog entry for a model name, a plugin's, or None when unknown."""
    if name in MODELS:
        return MODELS[name]
    if name in _plugin_names(MODEL_ENTRY_POINT_GROUP):
        return CatalogEntry(args=None, task="any")
    return None


def dataset_entry(name: str) -> CatalogEntry | None:
    """The catalog entry for a dataset name, a plugin's, or None when unknown."""
    if name in DATASETS:
        return DATASETS[name]
    if name in _plugin_names(DATASET_ENTRY_POINT_GROUP):
        return CatalogEntry(args=None, task="any")
    return None


def known_models() -> list[str]:
    return sorted(set(MODELS) | _plugin_names(MODEL_ENTRY_POINT_GROUP))


def known_datasets() -> list[str]:
    return sorted(set(DATASETS) | _plugin_names(DATASET_ENTRY_POINT_GROUP))


def validate_args(entry: CatalogEntry, args: dict[str, Any]) -> dict[str, Any]:
    """Arguments with defaults filled in; raises pydantic.ValidationError when out of bounds."""
    if entry.args is None:
        return dict(args)
    return entry.args.model_validate(args).model_dump()
