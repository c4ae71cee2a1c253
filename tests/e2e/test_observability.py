"""TensorBoard, profiler traces, system metrics and MLflow, end to end: a real API and worker, torchrun with two
gloo ranks, and the files read back by TensorBoard's own reader, gzip/json, and a real MLflow server."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from stack.mlflow_server import mlflow_command
from stack.mlflow_server import mlflow_server as start_mlflow_server
from tests.helpers import Services, assert_resumed_after_a_kill, wait_until
from torchyard.cli.main import app as cli_app

pytestmark = pytest.mark.slow

SPEC = {
    "name": "observed",
    "model": {"name": "mlp", "args": {"hidden": 16}},
    "data": {"name": "synthetic-classification", "args": {"samples": 512, "eval_samples": 128, "features": 8, "classes": 4}},
    "parallel": {"strategy": "ddp", "nproc_per_node": 2},
    "train": {"epochs": 1, "global_batch_size": 32, "lr": 0.01, "log_every_steps": 2},
    "eval": {"every_steps": 8},
    "checkpoint": {"every_steps": 100},
}


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def _metric(client: httpx.Client, job_id: str, name: str) -> list[tuple[int, float]]:
    items = client.get(f"/v1/jobs/{job_id}/metrics", params={"name": name, "limit": 10000}).json()["items"]
    return [(m["step"], m["value"]) for m in items]


def _scalars(logdir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})  # 0: keep every point, no sampling
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def test_tensorboard_profiler_and_system_metrics(services: Services, tmp_path: Path) -> None:
    services.start_api()
    services.start_worker()
    spec = {**SPEC, "profile": {"start_step": 3, "steps": 2, "memory": True}}
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=spec).json()["id"]
        job = services.wait_status(client, job_id, {"succeeded", "failed", "cancelled"}, timeout_s=240)
        assert job["status"] == "succeeded", job["error"]

        # TensorBoard: every train and eval scalar, the same steps and values as the API's.
        names = {"train/loss", "train/lr", "eval/loss", "eval/accuracy", "sys/cpu_percent"}
        files = [a["path"] for a in client.get(f"/v1/jobs/{job_id}/artifacts").json()["items"]]
        assert any(p.startswith("tensorboard/events.out.tfevents.") for p in files), files
        logdir = Path(job["run_dir"]) / "artifacts" / "tensorboard"
        for name in names:
            api, tb = _metric(client, job_id, name), _scalars(logdir, name)
            assert len(tb) == len(api) > 0, name
            assert [s for s, _ in tb] == [s for s, _ in api], name
            assert all(abs(a - b) <= 1e-6 * max(1.0, abs(a)) for (_, a), (_, b) in zip(api, tb, strict=True)), name
        assert len(_metric(client, job_id, "train/loss")) == 512 // 32 // 2

        # System metrics per rank at the log cadence, in the API and in `torchyard status`.
        latest = job["latest_metrics"]
        assert latest["sys/rss_bytes"] > 10e6 and "sys/cpu_percent" in latest
        assert latest["sys/rank0/rss_bytes"] > 10e6 and latest["sys/rank1/rss_bytes"] > 10e6
        assert "sys/gpu_util" not in latest  # CPU ranks: no NVML values are made up
        env = {"TORCHYARD_URL": services.url, "TORCHYARD_API_KEY": services.headers["Authorization"].removeprefix("Bearer ")}
        status = CliRunner().invoke(cli_app, ["status", job_id], env=env)
        assert status.exit_code == 0 and "sys/rss_bytes" in status.output and "sys/rank1/" not in status.output

        # Profiler: one trace per rank, Chrome trace JSON, downloaded through the artifacts route.
        assert {"profiler/rank0.json.gz", "profiler/rank1.json.gz"} <= set(files)
        trace = client.get(f"/v1/jobs/{job_id}/artifacts/profiler/rank1.json.gz")
        assert trace.status_code == 200
        events = json.loads(gzip.decompress(trace.content))["traceEvents"]
        assert any(e.get("name", "").startswith("aten::") for e in events)
        assert any(e.get("ph") == "i" and "[memory]" in e.get("name", "") for e in events)  # memory: true

        # A job without `profile` records no trace.
        plain = client.post("/v1/jobs", json={**SPEC, "name": "plain"}).json()["id"]
        assert services.wait_status(client, plain, {"succeeded", "failed"}, timeout_s=240)["status"] == "succeeded"
        assert not any(a["path"].startswith("profiler/") for a in client.get(f"/v1/jobs/{plain}/artifacts").json()["items"])

    # `torchyard tensorboard`: both jobs' event files in one logdir, a subdirectory each.
    out = tmp_path / "tb"
    result = CliRunner().invoke(cli_app, ["tensorboard", job_id, plain, "--logdir", str(out), "--print"], env=env)
    assert result.exit_code == 0, result.output
    assert "tensorboard" in result.output and str(out) in result.output
    runs = sorted(p.name for p in out.iterdir())
    assert runs == sorted([f"observed-{job_id}", f"plain-{plain}"])
    assert len(_scalars(out / f"observed-{job_id}", "train/loss")) == 8


# ------------------------------------------------------------------ MLflow


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One server for the module (it takes most of a minute to start on a busy machine): each test logs to an
    experiment of its own and reads back only that experiment's runs."""
    if mlflow_command() is None:
        pytest.skip("mlflow is not installed (pip install -e '.[test]' installs it)")
    with start_mlflow_server(tmp_path_factory.mktemp("mlflow")) as url:
        yield url


def test_mlflow_round_trip(services: Services, mlflow_server: str) -> None:
    from mlflow.tracking import MlflowClient

    services.start_api()
    services.start_worker(TORCHYARD_MLFLOW_TRACKING_URI=mlflow_server)
    spec = {**SPEC, "tracking": {"mlflow": {"experiment": "e2e-experiment"}}, "labels": {"team": "vision"}}
    with services.client() as client:
        job_id = client.post("/v1/jobs", json=spec).json()["id"]
        job = services.wait_status(client, job_id, {"succeeded", "failed", "cancelled"}, timeout_s=240)
        assert job["status"] == "succeeded", job["error"]
        api_loss = _metric(client, job_id, "train/loss")
        api_acc = _metric(client, job_id, "eval/accuracy")

    mlflow = MlflowClient(tracking_uri=mlflow_server)
    experiment = mlflow.get_experiment_by_name("e2e-experiment")
    assert experiment is not None
    runs = mlflow.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "observed"
    assert run.data.tags["torchyard.job_id"] == job_id and run.data.tags["label.team"] == "vision"
    assert run.data.params["train.lr"] == "0.01" and run.data.params["model.name"] == "mlp"
    history = sorted((m.step, m.value) for m in mlflow.get_metric_history(run.info.run_id, "train/loss"))
    assert [s for s, _ in history] == [s for s, _ in api_loss]
    assert all(abs(a - b) <= 1e-6 * max(1.0, abs(a)) for (_, a), (_, b) in zip(api_loss, history, strict=True))
    assert [m.step for m in mlflow.get_metric_history(run.info.run_id, "eval/accuracy")] == [s for s, _ in api_acc]
    assert [a.path for a in mlflow.list_artifacts(run.info.run_id, "weights")] == ["weights/model.safetensors"]



def test_a_killed_rank_leaves_one_mlflow_run_per_job_with_the_jobs_outcome(services: Services, mlflow_server: str) -> None:
    """Rank 0 is SIGKILLed mid-attempt, so its sink cannot end the run: the worker does. A job that resumes
    logs on into the same run, which ends FINISHED; a job with no retry left ends its run FAILED."""
    from mlflow.tracking import MlflowClient

    services.start_api()
    services.start_worker(TORCHYARD_MLFLOW_TRACKING_URI=mlflow_server,
                          # Slow first attempts (12 s before the kill), so rank 0's sink has opened its run (a few HTTP
                          # calls on a thread, which took over 3.6 s on a loaded machine) well before the kill.
                          TORCHYARD_FAULTS=json.dumps([{"action": "slow", "step": 1, "seconds": 1.0, "attempt": 1},
                                                       {"action": "slow", "step": 1, "seconds": 0.3, "attempt": 2},
                                                       {"action": "sigkill", "step": 12, "rank": 0, "attempt": 1}]))
    base = {**SPEC, "tracking": {"mlflow": {"experiment": "killed"}}, "checkpoint": {"every_steps": 2}}
    with services.client() as client:
        resumed = client.post("/v1/jobs", json={**base, "name": "resumed", "retries": 1}).json()["id"]
        # The worker runs both at once; the second starts once the first's rank 0 has its MLflow run (and the
        # experiment exists), so the two sinks never race to create the experiment.
        wait_until(lambda: client.get(f"/v1/jobs/{resumed}").json()["last_step"], 120, what="the first job's first step")
        failed = client.post("/v1/jobs", json={**base, "name": "failed", "retries": 0}).json()["id"]
        ends = {job_id: services.wait_status(client, job_id, {"succeeded", "failed", "cancelled"}, timeout_s=300)
                for job_id in (resumed, failed)}
        assert ends[resumed]["status"] == "succeeded", ends[resumed]["error"]
        assert_resumed_after_a_kill(ends[resumed])
        assert ends[failed]["status"] == "failed"
        api_steps = [s for s, _ in _metric(client, resumed, "train/loss")]

    mlflow = MlflowClient(tracking_uri=mlflow_server)
    experiment = mlflow.get_experiment_by_name("killed")
    assert experiment is not None
    found = mlflow.search_runs([experiment.experiment_id])
    runs = {r.data.tags["torchyard.job_id"]: r for r in found}
    assert len(found) == 2 and sorted(runs) == sorted([resumed, failed])  # one run per job, not per attempt
    assert runs[resumed].info.status == "FINISHED"
    assert runs[failed].info.status == "FAILED"
    # Both attempts logged into the one run: steps before the kill and after the resume.
    logged = {m.step for m in mlflow.get_metric_history(runs[resumed].info.run_id, "train/loss")}
    assert set(api_steps) <= logged and min(logged) < 12 < max(logged)
