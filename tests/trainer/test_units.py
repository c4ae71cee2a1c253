"""Fast trainer checks without torchrun: schedule, events, data, loader, plugins, spec refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from jobspec import catalog
from jobspec.exit_codes import SPEC_ERROR_EXIT_CODE
from jobspec.spec import ScheduleSpec
from tests.trainer.helpers import REPO, rank_env, spec
from torchyard.events import EventWriter, last_seq
from trainer.data import DataInfo, build_dataset
from trainer.data.loader import TrainBatches, eval_batches
from trainer.distributed import RankInfo
from trainer.models import build_model, model_blocks
from trainer.optim import lr_factor


def test_lr_warmup_then_cosine_to_floor() -> None:
    s = ScheduleSpec(name="cosine", warmup_steps=4, min_lr_ratio=0.1)
    assert [lr_factor(i, s, 20) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, s, 20) == pytest.approx(1.0)
    assert lr_factor(12, s, 20) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_factor(20, s, 20) == pytest.approx(0.1)
    assert lr_factor(50, ScheduleSpec(name="constant", warmup_steps=2), 20) == 1.0


def test_events_seq_continues_and_survives_a_torn_line(tmp_path: Path) -> None:
    w = EventWriter(tmp_path, enabled=True)
    w.metric(1, 0, {"train/loss": float("nan")})
    w.status("training")
    w.close()
    with (tmp_path / "events.jsonl").open("a") as f:
        f.write('{"seq": 3, "ti')  # a crash mid-line
    assert last_seq(tmp_path / "events.jsonl") == 2
    w = EventWriter(tmp_path, enabled=True)
    w.status("done")
    w.close()
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["values"]["train/loss"] is None  # NaN is not JSON
    assert json.loads(lines[-1])["seq"] == 3
    off = EventWriter(tmp_path / "other", enabled=False)  # ranks other than 0 write nothing
    off.status("done")
    assert not (tmp_path / "other").exists()


def _rank(r: int, ws: int) -> RankInfo:
    return RankInfo(r, r, ws, ws, torch.device("cpu"), "gloo")


def test_global_batch_is_the_same_whatever_the_world_size() -> None:
    ds = build_dataset("synthetic-regression", {"samples": 200, "eval_samples": 0}, None).train
    one = TrainBatches(ds, _rank(0, 1), 32, 1, seed=5)
    two = [TrainBatches(ds, _rank(r, 2), 32, 2, seed=5) for r in range(2)]  # 2 ranks x 2 micro x 8
    assert one.steps_per_epoch == two[0].steps_per_epoch == 6
    for epoch in (0, 1):
        full = [b[0][0] for b in one.epoch(epoch)]
        split = [list(b.epoch(epoch)) for b in two]
        for step, x in enumerate(full):
            parts = torch.cat([m[0] for r in range(2) for m in split[r][step]])
            assert sorted(map(tuple, parts.tolist())) == sorted(map(tuple, x.tolist()))
    resumed = list(two[1].epoch(1, start_step=4))  # resume inside an epoch
    assert torch.equal(resumed[0][1][0], list(two[1].epoch(1))[4][1][0])


def test_eval_shards_cover_every_sample_once() -> None:
    ds = build_dataset("synthetic-classification", {"samples": 16, "eval_samples": 13}, None).eval
    seen = []
    counts = []
    for r in range(3):
        batches = list(eval_batches(ds, _rank(r, 3), 2, None))
        counts.append(len(batches))
        seen += [tuple(x.tolist()) for xb, _, v in batches for x in xb[v]]
    assert len(set(counts)) == 1  # the same number of forward passes on every rank (FSDP collectives)
    assert sorted(seen) == sorted(tuple(x.tolist()) for x in ds.x)


def test_synthetic_sets_are_seeded() -> None:
    a = build_dataset("synthetic-lm", {"samples": 32, "vocab_size": 17, "seq_len": 8}, None)
    b = build_dataset("synthetic-lm", {"samples": 32, "vocab_size": 17, "seq_len": 8}, None)
    x, y = a.train.get_batch(torch.arange(4))
    assert torch.equal(x, b.train.get_batch(torch.arange(4))[0])
    assert torch.equal(x[:, 1:], y[:, :-1]) and x.shape == (4, 8) and int(x.max()) < 17
    img = build_dataset("synthetic-classification", {"samples": 16, "image_size": 8, "channels": 1}, None)
    assert img.info == DataInfo("classification", (1, 8, 8), 10)


def test_synthetic_lm_at_a_real_vocabulary_is_a_learnable_chain() -> None:
    # GPT-2's vocabulary, and the catalog's largest: a dense vocab x vocab chain was 10 GB at 50,304 and could not
    # be allocated at 1,000,000; the set is a few successors per token.
    for vocab in (50_304, 1_000_000):
        bundle = build_dataset("synthetic-lm", {"samples": 64, "eval_samples": 0, "vocab_size": vocab, "seq_len": 128}, None)
        x, y = bundle.train.get_batch(torch.arange(64))
        assert int(x.max()) < vocab and torch.equal(x[:, 1:], y[:, :-1])
        # Learnable: after a token only a handful of tokens ever follow (a uniform draw would give ~all distinct).
        pairs = torch.stack([x.flatten(), y.flatten()], 1).tolist()
        followers: dict[int, set[int]] = {}
        for a, b in pairs:
            followers.setdefault(a, set()).add(b)
        assert max(len(s) for s in followers.values()) <= 8
        assert len(set(x.flatten().tolist())) > 1000  # and the walks visit much of the vocabulary


@pytest.mark.parametrize("suffix", [".pt", ".npz", ".safetensors"])
def test_tensor_files_under_the_data_root(tmp_path: Path, suffix: str) -> None:
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    path = tmp_path / f"set{suffix}"
    if suffix == ".pt":
        torch.save({"x": x, "y": y}, path)
    elif suffix == ".npz":
        np.savez(path, x=x.numpy(), y=y.numpy())
    else:
        save_file({"x": x, "y": y}, str(path))
    bundle = build_dataset("tensor-file", {"path": path.name}, tmp_path)
    assert bundle.info == DataInfo("classification", (6,), int(y.max()) + 1)
    assert torch.allclose(bundle.train.get_batch(torch.tensor([3]))[0], x[3:4])


def test_text_file_and_refused_paths(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "t.txt").write_text("héllo wörld " * 50, encoding="utf-8")
    (tmp_path / "secret.txt").write_text("outside")
    (root / "link.txt").symlink_to(tmp_path / "secret.txt")
    bundle = build_dataset("text-file", {"path": "t.txt", "seq_len": 16, "eval_fraction": 0.2}, root)
    assert bundle.info.task == "lm" and bundle.info.num_outputs == 256 and bundle.eval is not None
    for bad in ("../secret.txt", "link.txt", str(tmp_path / "secret.txt")):
        with pytest.raises(ValueError, match="outside the data root"):
            build_dataset("text-file", {"path": bad}, root)
    with pytest.raises(ValueError, match="TORCHYARD_DATA_DIR"):
        build_dataset("text-file", {"path": "t.txt"}, None)


def test_trainer_refuses_a_data_path_outside_the_root(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    job = spec("escape", nproc=1, data={"name": "text-file", "args": {"path": "../../etc/passwd"}},
               model={"name": "gpt", "args": {}})
    (tmp_path / "job.json").write_text(json.dumps(job))
    proc = subprocess.run([sys.executable, "-m", "trainer", "--spec", str(tmp_path / "job.json"), "--run-dir", str(tmp_path / "r")],
                          env=rank_env(TORCHYARD_DATA_DIR=str(tmp_path / "data")), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == SPEC_ERROR_EXIT_CODE, proc.stderr[-2000:]
    assert "outside the data root" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_every_catalog_model_builds_with_blocks() -> None:
    infos = {"mlp": DataInfo("classification", (8,), 3), "cnn": DataInfo("classification", (3, 8, 8), 3),
             "resnet": DataInfo("classification", (3, 8, 8), 3), "vit": DataInfo("classification", (3, 8, 8), 3),
             "gpt": DataInfo("lm", (16,), 50)}
    assert set(infos) == set(catalog.MODELS)
    for name, info in infos.items():
        model = build_model(name, {}, info)
        assert len(model_blocks(model)) >= 1
        x = torch.randint(0, 50, (2, 16)) if name == "gpt" else torch.randn(2, *info.input_shape)
        assert model(x).shape[-1] == info.num_outputs


PLUGIN = '''
import torch
from torch import nn
from trainer.data import DataInfo, DatasetBundle, DatasetSplits, TensorPairs

def model(args, info):
    return nn.Linear(info.input_shape[0], info.num_outputs * args.get("mult", 1))

def dataset(args, data_dir):
    x = torch.randn(args.get("n", 64), 5)
    return DatasetSplits(TensorPairs(x, (x.sum(1) > 0).long()), None, DataInfo("classification", (5,), 2))

def dataset_by_its_earlier_name(args, data_dir):  # a plugin written before DatasetSplits was named so
    x = torch.randn(args.get("n", 64), 5)
    return DatasetBundle(TensorPairs(x, (x.sum(1) > 0).long()), None, DataInfo("classification", (5,), 2))
'''


def test_plugins_through_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "typlugin.py").write_text(PLUGIN)
    dist_info = tmp_path / "typlugin-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: typlugin\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text("[torchyard.models]\nlinear = typlugin:model\n\n"
                                                "[torchyard.datasets]\nhalfspace = typlugin:dataset\n"
                                                "older = typlugin:dataset_by_its_earlier_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    catalog._plugin_names.cache_clear()
    try:
        assert "linear" in catalog.known_models() and catalog.dataset_entry("halfspace") is not None
        for name in ("halfspace", "older"):
            splits = build_dataset(name, {"n": 32}, None)
            model = build_model("linear", {"mult": 2}, splits.info)
            assert model(splits.train.get_batch(torch.arange(3))[0]).shape == (3, 4)
    finally:
        catalog._plugin_names.cache_clear()


def test_examples_are_valid_specs() -> None:
    import yaml

    from jobs.sweeps.spec import SweepSpec
    from jobspec.spec import load_spec_file, spec_from_dict

    files = sorted((REPO / "examples").glob("*.yaml"))
    assert files
    for f in files:
        if f.name.startswith("sweep-"):  # a sweep: its own schema, and its base spec a job spec
            sweep = SweepSpec.model_validate(yaml.safe_load(f.read_text()))
            assert spec_from_dict(sweep.spec).name
        else:
            assert load_spec_file(f).name


@pytest.mark.parametrize(("compile_", "device", "extra", "expected"), [
    (None, "cuda", {}, True),  # unset: compiled on a GPU
    (None, "cpu", {}, False),  # unset: eager on the CPU
    (None, "cuda", {"tensor": 2}, False),  # model parallelism does not compile yet
    (False, "cuda", {}, False),
    (True, "cpu", {}, True),
])
def test_train_compile_unset_compiles_on_cuda_only(compile_: bool | None, device: str, extra: dict, expected: bool) -> None:
    from jobspec.spec import parse_spec
    from trainer.parallel import compile_enabled

    job = spec("c", model={"name": "gpt", "args": {"n_layer": 2, "n_head": 2, "n_embd": 16, "block_size": 16}},
               data={"name": "synthetic-lm", "args": {"samples": 64, "vocab_size": 32, "seq_len": 16}}, nproc=2)
    if compile_ is not None:
        job["train"]["compile"] = compile_
    job["parallel"].update(extra, device=device)
    assert compile_enabled(parse_spec(job), torch.device(device)) is expected


@pytest.mark.parametrize("name", sorted(catalog.MODELS))
def test_each_catalog_model_has_one_spec_that_agrees_with_its_contract(name: str) -> None:
    # The catalog (the torch-free contract the API checks) says which models a pipeline or tensor parallelism
    # accepts; the model's SPEC says how. A model added to one and not the other fails here, not in a job.
    from trainer.models import full_args, model_spec

    entry, known = catalog.MODELS[name], model_spec(name)
    assert known is not None and known.name == name
    info = {"gpt": DataInfo("lm", (8,), 16), "mlp": DataInfo("classification", (6,), 3)}.get(
        name, DataInfo("classification", (3, 16, 16), 4))
    args = full_args(name, {"block_size": 8} if name == "gpt" else {})
    model = known.build(args, info)
    assert (entry.pipeline_blocks is None) == (known.pipeline is None)
    if known.pipeline is not None:
        blocks = getattr(model, known.pipeline.blocks)
        assert isinstance(blocks, torch.nn.ModuleDict) and len(blocks) == args[entry.pipeline_blocks]
        assert all(hasattr(model, a) for a in known.pipeline.first + known.pipeline.last)
    assert (entry.tensor_heads is None) == (known.tensor_plan is None)
    for block in model_blocks(model) if known.tensor_plan else []:
        assert all(isinstance(block.get_submodule(sub), torch.nn.Linear) for sub in known.tensor_plan)


def test_mfu_flops_come_from_the_model_spec_with_the_catalogs_defaults() -> None:
    # Left out of the spec, n_layer and n_embd are the catalog's defaults (2 and 128), as the model was built with.
    from jobspec.spec import parse_spec
    from trainer.loop import _flops_per_sample

    job = parse_spec({"name": "mfu", "model": {"name": "gpt", "args": {"block_size": 16}},
                      "data": {"name": "synthetic-lm", "args": {"samples": 16, "seq_len": 16, "vocab_size": 32}}})
    info = DataInfo("lm", (16,), 32)
    model = build_model("gpt", {"block_size": 16}, info)
    n = sum(p.numel() for p in model.parameters())
    assert _flops_per_sample(model, job, info) == (6 * n + 12 * 2 * 128 * 16) * 16
    mlp = parse_spec({"name": "mfu", "model": {"name": "mlp"}, "data": {"name": "synthetic-classification"}})
    assert _flops_per_sample(build_model("mlp", {}, DataInfo("classification", (32,), 10)), mlp, info) is None
