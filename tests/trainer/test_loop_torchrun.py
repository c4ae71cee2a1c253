"""End-to-end trainer behaviour under real torchrun (gloo, CPU, fp32 unless a case says otherwise).

Start-up (torch import, rendezvous) dominates these tiny jobs, so the jobs run in few launches:
one 2-rank launch runs every 2-rank case in turn (each in its own run dir), one 1-rank launch the
reference runs, and one 2-node launch checks HSDP.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from stack.redis_server import free_port
from tests.helpers import wait_until
from tests.trainer.helpers import REPO, RUN_CASES, assert_close_seq, events, rank_env, run_cases, spec, train_losses
from trainer.checkpoint import load_model

pytestmark = pytest.mark.slow

STEPS = 12
HSDP_DEADLINE_S = 600  # far past a healthy 2-node run (seconds) on a machine a second suite loads too
IMAGES = {"name": "synthetic-classification", "args": {"samples": 128, "eval_samples": 16, "image_size": 8, "channels": 3}}
TOKENS = {"name": "synthetic-lm", "args": {"samples": 128, "eval_samples": 16, "vocab_size": 64, "seq_len": 16}}
CATALOG = {
    "mlp": ({"name": "mlp", "args": {"hidden": 32}}, None),
    "cnn": ({"name": "cnn", "args": {"channels": 8, "blocks": 2}}, IMAGES),
    "resnet": ({"name": "resnet", "args": {"width": 8, "blocks_per_stage": [1, 1]}}, IMAGES),
    "vit": ({"name": "vit", "args": {"dim": 32, "depth": 2, "heads": 2, "patch_size": 4}}, IMAGES),
    "gpt": ({"name": "gpt", "args": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16}}, TOKENS),
}
GPT = CATALOG["gpt"]


def _case(tmp: Path, name: str, job: dict, **extra) -> dict:
    return {"spec": job, "run_dir": str(tmp / name), **extra}


def _with_fsdp(job: dict, **opts) -> dict:
    job["parallel"]["fsdp"] = opts
    return job


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("trainer")
    two = [
        _case(tmp, "ddp2", spec("ddp2", max_steps=STEPS)),
        _case(tmp, "fsdp2", spec("fsdp2", strategy="fsdp", max_steps=STEPS)),
        # Stop at step 4, resume: a fresh run dir holding only the step-4 checkpoint of the run above.
        _case(tmp, "resume-ddp", spec("ddp2", max_steps=STEPS, checkpoint={"every_steps": 4, "keep_last": 2}),
              resume_from=str(tmp / "ddp2" / "checkpoints" / "step_00000004")),
        _case(tmp, "resume-fsdp", spec("fsdp2", strategy="fsdp", max_steps=STEPS,
                                       checkpoint={"every_steps": 4, "keep_last": 3, "async_save": True}),
              resume_from=str(tmp / "fsdp2" / "checkpoints" / "step_00000004")),
    ]
    for name, (model, data) in CATALOG.items():
        if name != "mlp":
            for strategy in ("ddp", "fsdp"):
                two.append(_case(tmp, f"{name}-{strategy}", spec(name, model=model, data=data, strategy=strategy, max_steps=3,
                                                                  checkpoint={"every_steps": 100, "keep_last": 1})))
    two += [
        _case(tmp, "gpt-fsdp-ac-zero2", _with_fsdp(spec("g", model=GPT[0], data=GPT[1], strategy="fsdp", max_steps=3,
                                                        activation_checkpointing=True), reshard_after_forward=False)),
        _case(tmp, "gpt-fsdp-offload", _with_fsdp(spec("g", model=GPT[0], data=GPT[1], strategy="fsdp", max_steps=3), cpu_offload=True)),
        _case(tmp, "gpt-fsdp-bf16", spec("g", model=GPT[0], data=GPT[1], strategy="fsdp", max_steps=3, precision="bf16")),
        _case(tmp, "gpt-ddp-bf16", spec("g", model=GPT[0], data=GPT[1], max_steps=3, precision="bf16")),
    ]
    run_cases(tmp, 2, two)
    run_cases(tmp, 1, [
        _case(tmp, "ddp1", spec("ddp1", nproc=1, max_steps=STEPS)),
        _case(tmp, "accum1", spec("accum1", nproc=1, max_steps=STEPS, grad_accum_steps=4)),
    ])
    return tmp


def _done(run_dir: Path) -> dict:
    last = events(run_dir)[-1]
    assert last["type"] == "status" and last["phase"] == "done", last
    return last


def test_two_rank_ddp_equals_one_rank(runs: Path) -> None:
    two, one = train_losses(runs / "ddp2"), train_losses(runs / "ddp1")
    assert len(two) == STEPS
    assert_close_seq(two, one, 1e-5)
    assert two[STEPS] < two[1]  # it learns


def test_grad_accumulation_4x8_equals_batch_32(runs: Path) -> None:
    assert_close_seq(train_losses(runs / "accum1"), train_losses(runs / "ddp1"), 1e-5)


def test_fsdp_equals_ddp_and_halves_parameters_and_optimizer_state(runs: Path) -> None:
    assert_close_seq(train_losses(runs / "fsdp2"), train_losses(runs / "ddp2"), 1e-4)
    for model in ("fsdp2", "gpt-fsdp"):
        ddp, fsdp = _done(runs / model.replace("fsdp", "ddp")), _done(runs / model)
        for key in ("local_param_numel", "local_optim_numel"):
            full = ddp[key][0]  # DDP: every rank holds everything
            assert ddp[key] == [full, full]
            for held in fsdp[key]:  # measured on each rank after training: its shards only
                assert 0.45 * full <= held <= 0.55 * full, (key, fsdp[key], full)
            assert sum(fsdp[key]) >= full


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_resume_continues_the_loss_sequence(runs: Path, strategy: str) -> None:
    resumed, full = train_losses(runs / f"resume-{strategy}"), train_losses(runs / f"{strategy}2")
    assert min(resumed) == 5  # started after the checkpoint, not from scratch
    assert_close_seq(resumed, full, 1e-6, range(5, STEPS + 1))
    status = [e for e in events(runs / f"resume-{strategy}") if e["type"] == "status"]
    assert status[1]["phase"] == "training" and status[1]["resumed_from_step"] == 4


def test_async_checkpoints_commit_and_load(runs: Path) -> None:
    run = runs / "resume-fsdp"
    assert [e["step"] for e in events(run) if e["type"] == "checkpoint"] == [8, 12]
    mid = load_model(run / "checkpoints" / "step_00000008")  # written in the background, DCP sharded
    assert mid.head.weight.shape == (10, 32)


@pytest.mark.parametrize("model", [m for m in CATALOG if m != "mlp"])
def test_every_catalog_model_trains_under_ddp_and_fsdp(runs: Path, model: str) -> None:
    ddp, fsdp = train_losses(runs / f"{model}-ddp"), train_losses(runs / f"{model}-fsdp")
    assert len(ddp) == 3 and all(torch.isfinite(torch.tensor(v)) for v in ddp.values())
    assert_close_seq(fsdp, ddp, 1e-4)
    assert load_model(runs / f"{model}-fsdp").training is False
    if model == "gpt":
        metric = next(e for e in events(runs / "gpt-ddp") if e["type"] == "metric" and "train/loss" in e["values"])
        assert metric["values"]["train/tokens_per_s"] == pytest.approx(metric["values"]["train/samples_per_s"] * 16)


def test_fsdp_variants_match_plain_fsdp(runs: Path) -> None:
    plain = train_losses(runs / "gpt-fsdp")
    for variant in ("gpt-fsdp-ac-zero2", "gpt-fsdp-offload"):
        assert_close_seq(train_losses(runs / variant), plain, 1e-4)
    for variant in ("gpt-fsdp-bf16", "gpt-ddp-bf16"):  # lower precision: close, not equal
        assert_close_seq(train_losses(runs / variant), plain, 2e-2)


def test_events_contract(runs: Path) -> None:
    evs = events(runs / "ddp2")
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    assert [e["phase"] for e in evs if e["type"] == "status"] == ["starting", "training", "done"]
    # Where the start went, by phase (run_cases starts its jobs itself: no imports or process group of their own);
    # the phases split the time from the start without a gap, so a slow one cannot hide between them.
    startup = next(e for e in evs if e.get("phase") == "training")["startup"]
    phases = {k: v for k, v in startup.items() if k not in ("since_process_start_s", "process_started_at")}
    assert list(phases) == ["events", "data", "model", "to_device", "parallelize", "optimizer", "checkpoint_load"], startup
    assert min(phases.values()) >= 0 and sum(phases.values()) == pytest.approx(startup["since_process_start_s"], abs=0.01)
    ckpts = [e for e in evs if e["type"] == "checkpoint"]
    assert [e["step"] for e in ckpts] == [4, 8, 12]
    assert ckpts[-1]["path"] == "checkpoints/step_00000012" and "weights" in ckpts[-1]
    metric = next(e for e in evs if e["type"] == "metric" and e["step"] == STEPS and "train/loss" in e["values"])
    expected = {"train/loss", "train/lr", "train/grad_norm", "train/samples_per_s", "train/step_time_s", "train/mem_bytes"}
    assert expected <= set(metric["values"])
    ev = [e for e in evs if e["type"] == "metric" and "eval/loss" in e["values"]]
    assert ev and ev[-1]["step"] == STEPS and 0.0 <= ev[-1]["values"]["eval/accuracy"] <= 1.0
    # Eval is exact over both ranks' shards: the 1-rank run gets the same numbers.
    ev1 = [e for e in events(runs / "ddp1") if e["type"] == "metric" and "eval/loss" in e["values"]]
    assert ev1[-1]["values"]["eval/loss"] == pytest.approx(ev[-1]["values"]["eval/loss"], abs=1e-5)
    assert ev1[-1]["values"]["eval/accuracy"] == ev[-1]["values"]["eval/accuracy"]


def test_checkpoints_load_without_distributed(runs: Path) -> None:
    ckdir = runs / "fsdp2" / "checkpoints"
    assert (ckdir / "latest").read_text() == "step_00000012"
    assert not list(ckdir.glob(".tmp-*"))
    final = load_model(runs / "fsdp2")  # follows checkpoints/latest; uses the consolidated weights
    weights = load_file(str(ckdir / "step_00000012" / "model.safetensors"))
    assert set(weights) == set(final.state_dict())
    for name, tensor in final.state_dict().items():
        assert torch.equal(tensor, weights[name])
    mid = load_model(ckdir / "step_00000008")  # an intermediate checkpoint: sharded DCP files only
    assert not torch.equal(mid.head.weight, final.head.weight)
    assert final(torch.randn(4, 16)).shape == (4, 10)


def test_keep_last_prunes_old_checkpoints(runs: Path) -> None:
    ckdir = runs / "resume-ddp" / "checkpoints"
    assert sorted(p.name for p in ckdir.glob("step_*")) == ["step_00000008", "step_00000012"]
    assert (ckdir / "latest").read_text() == "step_00000012"


def _node(node_rank: int, port: int, cases: Path) -> subprocess.Popen[str]:
    # As the worker launches a gang (worker/launch.py): node 0 hosts the rendezvous store, said explicitly (on one
    # machine both agents would otherwise race to host it), and every deadline is far past a run on a loaded machine:
    # a store read waits for the other node's agent (TCPStore::doWait) only 60 s by torchrun's default.
    conf = f"join_timeout={HSDP_DEADLINE_S},read_timeout={HSDP_DEADLINE_S},is_host={'true' if node_rank == 0 else 'false'}"
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node_rank}", "--nproc-per-node=1",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=hsdp", f"--rdzv-conf={conf}",
         str(RUN_CASES), str(cases)],
        env=rank_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _listening(proc: subprocess.Popen[str], port: int) -> bool:
    try:
        conns = psutil.Process(proc.pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in conns)


def _store_host(cases: Path) -> tuple[subprocess.Popen[str], int]:
    """Node 0, once it listens on its store's port. Another process may take a free port before node 0 binds it:
    then node 0 exits at once and a fresh port is tried; any other exit fails the test with its output."""
    for _ in range(3):
        port = free_port()
        node0 = _node(0, port, cases)
        wait_until(lambda node0=node0, port=port: node0.poll() is not None or _listening(node0, port), HSDP_DEADLINE_S, interval_s=0.1,
                   what="node 0 to host the rendezvous store")
        if node0.poll() is None:
            return node0, port
        out = node0.communicate()[0]
        assert "address already in use" in out.lower(), out[-3000:]
    raise AssertionError("three free ports were taken before node 0 could bind one")


def _outputs(procs: list[subprocess.Popen[str]]) -> list[str]:
    """Both nodes' output once they exit; past the deadline both are killed and the test fails with what they said
    (pytest's own timeout would end the test first and lose it)."""
    try:
        return [p.communicate(timeout=HSDP_DEADLINE_S)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # the agent and its rank, which holds the output pipe too
        outs = [p.communicate()[0] for p in procs]
        raise AssertionError(f"the two nodes ran past {HSDP_DEADLINE_S} s:\n" + outs[0][-3000:] + outs[1][-3000:]) from None


@pytest.mark.timeout(3 * HSDP_DEADLINE_S)  # its own deadlines fire first, with the nodes' output
def test_hsdp_on_two_nodes_equals_ddp(runs: Path, tmp_path: Path) -> None:
    """Two torchrun agents on this host as two nodes: FSDP2 builds a 2-D (replicate, shard) mesh."""
    job = spec("hsdp", nproc=1, strategy="fsdp", max_steps=STEPS)
    job["parallel"]["nnodes"] = 2
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([_case(tmp_path, "hsdp", job)]))
    node0, port = _store_host(cases)
    procs = [node0, _node(1, port, cases)]
    outs = _outputs(procs)
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    training = next(e for e in events(tmp_path / "hsdp") if e.get("phase") == "training")
    assert training["mesh"] == {"replicate": 2, "shard": 1}
    assert_close_seq(train_losses(tmp_path / "hsdp"), train_losses(runs / "ddp2"), 1e-4)
