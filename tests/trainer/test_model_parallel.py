"""Pipeline and tensor parallelism under real torchrun (gloo, CPU, fp32): the same losses as one rank,
a fraction of the parameters per rank, exact resume, and 2-D meshes on 4 ranks.

Three launches (1, 2 and 4 ranks), each running its cases in turn, as in test_loop_torchrun.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.helpers import assert_close_seq, events, run_cases, spec, train_losses
from trainer.checkpoint import load_model

pytestmark = pytest.mark.slow

STEPS = 6
TOKENS = {"name": "synthetic-lm", "args": {"samples": 256, "eval_samples": 32, "vocab_size": 64, "seq_len": 16}}
# Untied: a pipeline's first and last stages each hold their own embedding and head.
GPT = {"name": "gpt", "args": {"n_layer": 4, "n_head": 2, "n_embd": 32, "block_size": 16, "tie_embeddings": False}}
MLP = {"name": "mlp", "args": {"hidden": 32, "layers": 2}}


def _job(name: str, nproc: int, model: dict = GPT, strategy: str = "ddp", **parallel: object) -> dict:
    job = spec(name, model=model, data=TOKENS if model is GPT else None, nproc=nproc, strategy=strategy, max_steps=STEPS)
    job["parallel"].update(parallel)
    return job


def _pp(schedule: str, microbatches: int = 4) -> dict:
    return {"stages": 2, "microbatches": microbatches, "schedule": schedule}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("model-parallel")

    def case(name: str, job: dict, resume: str | None = None) -> dict:
        extra = {"resume_from": str(tmp / resume / "checkpoints" / "step_00000004")} if resume else {}
        return {"spec": job, "run_dir": str(tmp / name), **extra}

    run_cases(tmp, 1, [case("one", _job("one", 1)), case("one-mlp", _job("one-mlp", 1, MLP))])
    run_cases(tmp, 2, [
        case("gpipe", _job("gpipe", 2, pipeline=_pp("gpipe"))),
        case("1f1b", _job("1f1b", 2, pipeline=_pp("1f1b"))),
        case("interleaved", _job("interleaved", 2, pipeline=_pp("interleaved_1f1b"))),
        case("mlp-pp", _job("mlp-pp", 2, MLP, pipeline=_pp("1f1b"))),
        case("tp", _job("tp", 2, tensor=2)),
        # Stopped at step 4 (a fresh run dir holding only that checkpoint) and resumed.
        case("1f1b-resumed", _job("1f1b", 2, pipeline=_pp("1f1b")), resume="1f1b"),
        case("tp-resumed", _job("tp", 2, tensor=2), resume="tp"),
    ])
    run_cases(tmp, 4, [
        case("dp-pp-ddp", _job("dp-pp-ddp", 4, pipeline=_pp("1f1b", 2))),
        case("dp-pp-fsdp", _job("dp-pp-fsdp", 4, strategy="fsdp", pipeline=_pp("gpipe", 2))),
        case("dp-tp-fsdp", _job("dp-tp-fsdp", 4, strategy="fsdp", tensor=2)),
    ])
    return tmp


def _done(run_dir: Path) -> dict:
    last = events(run_dir)[-1]
    assert last["type"] == "status" and last["phase"] == "done", last
    return last


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved", "tp"])
def test_two_ranks_train_the_same_losses_as_one(runs: Path, name: str) -> None:
    one = train_losses(runs / "one")
    assert len(one) == STEPS and one[STEPS] < one[1]
    assert_close_seq(train_losses(runs / name), one, 1e-4)
    evals = [e["values"]["eval/loss"] for e in events(runs / name) if e["type"] == "metric" and "eval/loss" in e["values"]]
    reference = [e["values"]["eval/loss"] for e in events(runs / "one") if e["type"] == "metric" and "eval/loss" in e["values"]]
    assert evals == pytest.approx(reference, abs=1e-4)


def test_mlp_pipeline_trains_the_same_losses_as_one_rank(runs: Path) -> None:
    assert_close_seq(train_losses(runs / "mlp-pp"), train_losses(runs / "one-mlp"), 1e-4)


@pytest.mark.parametrize("name", ["1f1b", "interleaved", "tp"])
def test_each_rank_holds_well_under_the_whole_model(runs: Path, name: str) -> None:
    whole = _done(runs / "one")["local_param_numel"][0]
    held = _done(runs / name)
    for params in held["local_param_numel"]:
        assert params < 0.6 * whole, (held["local_param_numel"], whole)
    for optim in held["local_optim_numel"]:  # AdamW's two moments of what the rank holds, not of the whole model
        assert optim < 0.6 * 2 * whole
    assert sum(held["local_param_numel"]) >= whole


@pytest.mark.parametrize("name", ["1f1b", "tp"])
def test_stop_and_resume_equals_the_uninterrupted_run(runs: Path, name: str) -> None:
    resumed, full = train_losses(runs / f"{name}-resumed"), train_losses(runs / name)
    assert min(resumed) == 5
    assert_close_seq(resumed, full, 1e-6, range(5, STEPS + 1))
    # The checkpoint holds the whole model under its own names: it loads without torch.distributed.
    model = load_model(runs / name)
    assert sorted(model.h.keys()) == ["0", "1", "2", "3"]


@pytest.mark.parametrize("name", ["dp-pp-ddp", "dp-pp-fsdp", "dp-tp-fsdp"])
def test_four_ranks_on_a_two_dimensional_mesh(runs: Path, name: str) -> None:
    starting = [e for e in events(runs / name) if e["type"] == "status" and e["phase"] == "training"][0]
    second = "pp" if "pp" in name else "tp"
    assert starting["mesh"] == {"dp": 2, second: 2}
    assert_close_seq(train_losses(runs / name), train_losses(runs / "one"), 1e-4)
    assert len(_done(runs / name)["local_param_numel"]) == 4
    # The copy to the device is its own start-up phase in these layouts too, after the mesh and a pipeline's split.
    assert list(starting["startup"])[:5] == ["events", "data", "model", "to_device", "parallelize"], starting["startup"]
