"""End-to-end trainer behaviour under real torchrun (gloo, CPU, fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.helpers import assert_close_seq, events, run_cases, spec, train_losses
from trainer.checkpoint import load_model

pytestmark = pytest.mark.slow

STEPS = 12


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All jobs of this module: one 2-rank launch and one 1-rank launch."""
    tmp = tmp_path_factory.mktemp("trainer")
    two = [
        {"spec": spec("ddp2", max_steps=STEPS), "run_dir": str(tmp / "ddp2")},
    ]
    one = [
        {"spec": spec("ddp1", nproc=1, max_steps=STEPS), "run_dir": str(tmp / "ddp1")},
        {"spec": spec("accum1", nproc=1, max_steps=STEPS, grad_accum_steps=4), "run_dir": str(tmp / "accum1")},
    ]
    run_cases(tmp, 2, two)
    run_cases(tmp, 1, one)
    # Stop-at-step-4 then resume: a fresh run dir holding only ddp2's step-4 checkpoint (2 ranks).
    resume = [{"spec": spec("ddp2", max_steps=STEPS, checkpoint={"every_steps": 4, "keep_last": 2}), "run_dir": str(tmp / "resume2"),
               "resume_from": str(tmp / "ddp2" / "checkpoints" / "step_00000004")}]
    run_cases(tmp, 2, resume)
    return tmp


def test_two_rank_ddp_equals_one_rank(runs: Path) -> None:
    two, one = train_losses(runs / "ddp2"), train_losses(runs / "ddp1")
    assert len(two) == STEPS
    assert_close_seq(two, one, 1e-5)
    assert two[STEPS] < two[1]  # it learns


def test_grad_accumulation_4x8_equals_batch_32(runs: Path) -> None:
    assert_close_seq(train_losses(runs / "accum1"), train_losses(runs / "ddp1"), 1e-5)


def test_resume_continues_the_loss_sequence(runs: Path) -> None:
    resumed, full = train_losses(runs / "resume2"), train_losses(runs / "ddp2")
    assert min(resumed) == 5  # started after the checkpoint, not from scratch
    assert_close_seq(resumed, full, 1e-6, range(5, STEPS + 1))
    status = [e for e in events(runs / "resume2") if e["type"] == "status"]
    assert status[1]["phase"] == "training" and status[1]["resumed_from_step"] == 4


def test_events_contract(runs: Path) -> None:
    evs = events(runs / "ddp2")
    seqs = [e["seq"] for e in evs]
    assert seqs == list(range(1, len(evs) + 1))
    assert [e["phase"] for e in evs if e["type"] == "status"] == ["starting", "training", "done"]
    ckpts = [e for e in evs if e["type"] == "checkpoint"]
    assert [e["step"] for e in ckpts] == [4, 8, 12]
    assert ckpts[-1]["path"] == "checkpoints/step_00000012" and "weights" in ckpts[-1]
    metric = next(e for e in evs if e["type"] == "metric" and e["step"] == STEPS and "train/loss" in e["values"])
    expected = {"train/loss", "train/lr", "train/grad_norm", "train/samples_per_s", "train/step_time_s", "train/mem_bytes"}
    assert expected <= set(metric["values"])
    ev = [e for e in evs if e["type"] == "metric" and "eval/loss" in e["values"]]
    assert ev and ev[-1]["step"] == STEPS and 0.0 <= ev[-1]["values"]["eval/accuracy"] <= 1.0


def test_checkpoints_load_without_distributed(runs: Path) -> None:
    ckdir = runs / "ddp2" / "checkpoints"
    assert (ckdir / "latest").read_text() == "step_00000012"
    assert not list(ckdir.glob(".tmp-*"))
    final = load_model(runs / "ddp2")  # follows checkpoints/latest; uses the consolidated weights
    weights = load_file(str(ckdir / "step_00000012" / "model.safetensors"))
    for name, tensor in final.state_dict().items():
        assert torch.equal(tensor, weights[name])
    # An intermediate checkpoint (DCP only) loads too, and differs from the final weights.
    mid = load_model(ckdir / "step_00000008")
    assert not torch.equal(mid.head.weight, final.head.weight)
    x = torch.randn(4, 16)
    assert final(x).shape == (4, 10)


def test_keep_last_prunes_old_checkpoints(runs: Path) -> None:
    ckdir = runs / "resume2" / "checkpoints"
    assert sorted(p.name for p in ckdir.glob("step_*")) == ["step_00000008", "step_00000012"]
    assert (ckdir / "latest").read_text() == "step_00000012"
