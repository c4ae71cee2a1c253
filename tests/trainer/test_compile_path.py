"""``train.compile`` on the CPU: a tiny gpt trains compiled (one rank: the whole model as one graph) to the eager
run's losses, and a compiled run resumes from its checkpoint. Inductor builds C++ here, so this takes a while."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.helpers import assert_close_seq, events, run_cases, spec, train_losses

pytestmark = pytest.mark.slow

STEPS = 8
GPT = {"name": "gpt", "args": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16}}
TOKENS = {"name": "synthetic-lm", "args": {"samples": 256, "eval_samples": 16, "vocab_size": 64, "seq_len": 16}}


def _gpt(name: str, **train) -> dict:
    return spec(name, model=GPT, data=TOKENS, nproc=1, max_steps=STEPS, checkpoint={"every_steps": 4, "keep_last": 3}, **train)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("compile")
    run_cases(tmp, 1, [
        {"spec": _gpt("eager"), "run_dir": str(tmp / "eager")},
        {"spec": _gpt("compiled", compile=True), "run_dir": str(tmp / "compiled")},
        {"spec": _gpt("compiled", compile=True), "run_dir": str(tmp / "resumed"),
         "resume_from": str(tmp / "compiled" / "checkpoints" / "step_00000004")},
    ], timeout=900)
    return tmp


def test_a_compiled_gpt_trains_to_the_eager_losses(runs: Path) -> None:
    compiled, eager = train_losses(runs / "compiled"), train_losses(runs / "eager")
    assert len(compiled) == STEPS
    assert_close_seq(compiled, eager, 1e-4)
    assert [e["phase"] for e in events(runs / "compiled") if e["type"] == "status"][-1] == "done"


def test_a_compiled_run_resumes_from_its_checkpoint(runs: Path) -> None:
    resumed = train_losses(runs / "resumed")
    assert min(resumed) == 5
    assert_close_seq(resumed, train_losses(runs / "compiled"), 1e-4, range(5, STEPS + 1))
