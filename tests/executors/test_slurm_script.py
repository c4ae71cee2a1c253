"""The Slurm executor's pieces that need no cluster: its batch script, the environment it hands to
Slurm, the operator's sbatch options, and how Slurm's records become states and verdicts. The one
slow test runs a two-node batch script with srun played by the test (one host has one Slurm node)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from jobs.settings import Settings
from jobs.store.models import ErrorType
from tests.deploy.test_manifests import _shims
from tests.executors.conftest import events, executor_settings, job_spec, phases, request
from worker.executors.base import EngineReason, Phase, RankState, engine_verdict
from worker.executors.slurm import JobRecord, SlurmExecutor, _exit_code, _seconds
from worker.launch import trainer_main


def _executor(tmp_path: Path, **overrides: object) -> SlurmExecutor:
    values: dict[str, object] = {"executor": "slurm", "slurm_cpus_per_rank": 3, "slurm_gpus": True}
    values.update(overrides)
    return SlurmExecutor(executor_settings(tmp_path, **values))


def _directives(script: str) -> set[str]:
    return set(re.findall(r"^#SBATCH (\S+)$", script, re.M))


def test_the_batch_script_asks_for_the_specs_nodes_and_lets_ranks_checkpoint(tmp_path: Path) -> None:
    executor = _executor(tmp_path)
    spec = job_spec(steps=4, nproc=4, parallel={"strategy": "ddp", "nproc_per_node": 4, "nnodes": 2, "device": "cuda"}, timeout_s=3600,
                    train={"epochs": 1, "global_batch_size": 64, "lr": 0.01})
    script = executor.batch_script(request(executor.settings, "j1", spec, attempt=2))
    path = tmp_path / "sbatch.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    # --time: timeout_s + the stop warning + Slurm's minute of signal resolution, rounded up to minutes.
    assert {"--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=4", "--cpus-per-task=12", "--no-requeue",
            "--signal=TERM@20", "--time=0-01:02:00", "--job-name=torchyard-j1-a2"} <= _directives(script)
    assert "--nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=\"$head_node:$rdzv_port\"" in script
    assert "--rdzv-conf=join_timeout=60" in script and "--standalone" not in script
    # The local executor's torchrun: the same interpreter, per-attempt log directory, the catalog trainer.
    assert f"--log-dir={tmp_path / 'runs' / 'j1' / 'logs' / 'attempt-2'}" in script
    assert f"--run-path --start-method=fork {trainer_main()} --spec" in script


@pytest.mark.parametrize(("device", "slurm_gpus", "gpus"),
                         [("cpu", True, None), ("auto", False, None), ("auto", True, 2), ("cuda", False, 2)])
def test_gpus_are_asked_for_when_the_job_wants_them(tmp_path: Path, device: str, slurm_gpus: bool, gpus: int | None) -> None:
    executor = _executor(tmp_path, slurm_gpus=slurm_gpus)
    spec = job_spec(steps=4, parallel={"strategy": "ddp", "nproc_per_node": 2, "device": device})
    directives = _directives(executor.batch_script(request(executor.settings, "j", spec)))
    assert ({f"--gpus-per-node={gpus}"} <= directives) if gpus else not any(d.startswith("--gpus") for d in directives)


def test_the_worker_s_settings_and_allocation_stay_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHYARD_DATABASE_URL", "postgresql+psycopg://torchyard:secret@db/torchyard")
    monkeypatch.setenv("TORCHYARD_ADMIN_TOKEN", "admin-secret")
    monkeypatch.setenv("SLURM_JOB_ID", "99")  # a worker that itself runs inside an allocation
    executor = _executor(tmp_path, slurm_conf=tmp_path / "slurm.conf")
    env = executor.job_env(request(executor.settings, "j2", job_spec(steps=4), attempt=3))
    assert "TORCHYARD_DATABASE_URL" not in env and "TORCHYARD_ADMIN_TOKEN" not in env and "SLURM_JOB_ID" not in env
    assert env["TORCHYARD_JOB_ID"] == "j2" and env["TORCHYARD_ATTEMPT"] == "3"
    assert env["TORCHYARD_RUN_DIR"] == str((tmp_path / "runs" / "j2").resolve())
    assert env["SLURM_CONF"] == str(tmp_path / "slurm.conf")


def test_operator_sbatch_options_are_allow_listed(tmp_path: Path) -> None:
    settings = Settings(slurm_sbatch_args="--qos=high --constraint='a100&ib' --exclusive")  # type: ignore[arg-type]
    assert settings.slurm_sbatch_args == ["--qos=high", "--constraint=a100&ib", "--exclusive"]
    for owned in ("--time=10", "--nodes=4", "--requeue", "--export=NONE", "--output=/tmp/x"):
        with pytest.raises(ValidationError, match=re.escape(owned.split("=")[0])):
            Settings(slurm_sbatch_args=owned)  # type: ignore[arg-type]


def _record(state: str, code: int | None = 0, **kw: object) -> JobRecord:
    values: dict[str, object] = {"reason": "None", "run_s": 30.0, "limit_s": 3600.0, "preempted": False}
    values.update(kw)
    return JobRecord(state=state, exit_code=code, **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(("record", "stopping", "phase", "reason", "verdict"), [
    (_record("PENDING", reason="Priority"), False, Phase.PENDING, None, None),
    (_record("PENDING", reason="PartitionConfig"), False, Phase.PENDING, EngineReason.UNSCHEDULABLE, ErrorType.SPEC),
    (_record("COMPLETING"), False, Phase.RUNNING, None, None),
    (_record("COMPLETED"), False, Phase.EXITED, None, None),
    (_record("FAILED", 1), False, Phase.EXITED, None, None),
    (_record("TIMEOUT", -15), False, Phase.EXITED, EngineReason.TIME_LIMIT, ErrorType.TIMEOUT),
    # The ranks stopped on --signal's early SIGTERM and exited themselves, a little before the limit.
    (_record("FAILED", 1, run_s=3560.0), False, Phase.EXITED, EngineReason.TIME_LIMIT, ErrorType.TIMEOUT),
    (_record("FAILED", 1, preempted=True), False, Phase.EXITED, EngineReason.PREEMPTED, ErrorType.PREEMPTED),
    (_record("PREEMPTED", -9), False, Phase.EXITED, EngineReason.PREEMPTED, ErrorType.PREEMPTED),
    (_record("NODE_FAIL", None), False, Phase.EXITED, EngineReason.NODE_FAILURE, ErrorType.WORKER_LOST),
    (_record("OUT_OF_MEMORY", 137), False, Phase.EXITED, EngineReason.OUT_OF_MEMORY, ErrorType.OOM),
    (_record("CANCELLED", -15), False, Phase.EXITED, EngineReason.CANCELLED, ErrorType.CANCELLED_BY_ENGINE),
    # Our own stop: a cancel, or an early exit near the limit, is not the engine's doing.
    (_record("CANCELLED", -15), True, Phase.EXITED, None, None),
    (_record("FAILED", 1, run_s=3560.0), True, Phase.EXITED, None, None),
    # Requeued by Slurm despite --no-requeue (an administrator's scontrol requeue): this attempt's run is over.
    (_record("PENDING", reason="BeginTime", restarts=1), False, Phase.EXITED, EngineReason.PREEMPTED, ErrorType.PREEMPTED),
    (_record("RUNNING", restarts=1), False, Phase.EXITED, EngineReason.PREEMPTED, ErrorType.PREEMPTED),
])
def test_slurm_records_become_states_and_verdicts(record: JobRecord, stopping: bool, phase: Phase,
                                                  reason: EngineReason | None, verdict: ErrorType | None) -> None:
    state = record.rank_state(warning_s=20, stopping=stopping)
    assert (state.phase, state.reason) == (phase, reason)
    found = engine_verdict(state)
    assert (found.error_type if found else None) == verdict


def test_verdicts_retry_as_the_same_end_on_a_local_worker() -> None:
    def verdict(reason: EngineReason) -> tuple[ErrorType, bool]:
        found = engine_verdict(RankState(Phase.EXITED, reason=reason))
        assert found is not None
        return found.error_type, found.retry

    assert verdict(EngineReason.TIME_LIMIT) == (ErrorType.TIMEOUT, False)  # as the supervisor's own timeout_s
    assert verdict(EngineReason.NODE_FAILURE) == (ErrorType.WORKER_LOST, False)  # as a lost worker: requeued, no retry spent
    assert verdict(EngineReason.PREEMPTED) == (ErrorType.PREEMPTED, False)  # as a preempted worker
    assert verdict(EngineReason.OUT_OF_MEMORY) == (ErrorType.OOM, True)  # as an OOM: retried while retries last
    assert verdict(EngineReason.CANCELLED) == (ErrorType.CANCELLED_BY_ENGINE, False)


@pytest.mark.parametrize(("text", "seconds"), [("00:01:00", 60), ("1-02:03:04", 93784), ("05:30", 330), ("7", 420),
                                               ("UNLIMITED", None), ("INVALID", None), ("", None)])
def test_slurm_durations(text: str, seconds: int | None) -> None:
    assert _seconds(text) == seconds


@pytest.mark.parametrize(("text", "code"), [("0:0", 0), ("75:0", 75), ("0:15", -15), ("", None), ("x", None)])
def test_slurm_exit_codes(text: str, code: int | None) -> None:
    assert _exit_code(text) == code


@pytest.mark.slow
def test_a_two_node_batch_script_trains_with_one_log_and_error_file_per_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch's part played here: the allocation's environment, and srun starting the node command once per node."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    executor = _executor(tmp_path, slurm_cpus_per_rank=1, slurm_gpus=False)
    spec = job_spec(steps=6, nproc=1, parallel={"strategy": "ddp", "nproc_per_node": 1, "nnodes": 2, "device": "cpu"})
    req = request(executor.settings, "twonodes", spec)
    script = tmp_path / "sbatch.sh"
    script.write_text(executor.batch_script(req))
    req.log_dir.mkdir(parents=True)
    env = {**executor.job_env(req), "PATH": f"{_shims(tmp_path)}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[1-2]"}
    proc = subprocess.run(["bash", str(script)], env=env, cwd=req.run_dir, capture_output=True, text=True, timeout=240)
    logs = {p.name: p.read_text(errors="replace")[-3000:] for p in req.log_dir.glob("launcher*.log")}
    assert proc.returncode == 0, (proc.stdout, proc.stderr, logs)
    assert set(logs) == {"launcher.log", "launcher-node-1.log"}
    assert phases(req.run_dir)[-1] == "done"
    assert [e["step"] for e in events(req.run_dir) if e["type"] == "checkpoint"][-1] == 6


def test_a_slurm_worker_without_slurms_commands_refuses_to_start_naming_them(tmp_path: Path) -> None:
    env = {**os.environ, "TORCHYARD_EXECUTOR": "slurm", "TORCHYARD_DATABASE_URL": f"sqlite:///{tmp_path / 'db'}",
           "TORCHYARD_SLURM_BIN_DIR": str(tmp_path)}  # no sbatch there: every job it took would fail
    proc = subprocess.run([sys.executable, "-m", "worker", "--burst"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "TORCHYARD_EXECUTOR=slurm" in proc.stderr and "sbatch, scontrol, scancel not found" in proc.stderr
