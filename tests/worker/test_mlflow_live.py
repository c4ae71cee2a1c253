"""A script that logs to MLflow with no tracking server set, unchanged, as a 2-rank CPU script job: MLflow writes its
default store (``mlflow.db`` in the working directory) and what the script logged is the job's metrics, at the steps
it gave, a series logged without a step numbered by order, a value that diverged a gap; the store itself is in the
job's artifacts for ``mlflow ui --backend-store-uri sqlite:///mlflow.db``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import Services
from tests.worker.frameworks import ddp_regression, metric_points, ranks_path, submit_script, wait_succeeded

pytestmark = pytest.mark.slow

STEPS = 20

SCRIPT = ddp_regression("mlflow", begin=f'''
    mlflow.set_experiment("regression")
    mlflow.start_run()
    mlflow.log_params({{"lr": 0.1, "steps": {STEPS}}})
''', log='''
    mlflow.log_metrics({"train/loss": loss.item(), "scale": float("nan") if step == 5 else 1.0}, step=step)
    mlflow.log_metric("lr", 0.1)  # no step: MLflow keeps each at step 0
''', end="mlflow.end_run()", steps=STEPS)


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_a_script_logging_to_mlflows_default_store_has_its_values_as_the_jobs_metrics(services: Services) -> None:
    mlflow = pytest.importorskip("mlflow")
    (services.settings.code_dir / "plain.py").write_text(SCRIPT)
    services.start_api()
    services.start_worker(PYTHONPATH=ranks_path(mlflow))
    with services.client() as client:
        job = wait_succeeded(services, client, submit_script(client, "mlflow", "plain.py"))

        logged = json.loads((Path(job["run_dir"]) / "workdir" / "losses.json").read_text())
        assert metric_points(client, job["id"], "train/loss") == pytest.approx(list(enumerate(logged)))
        assert logged[-1] < logged[0] / 10
        assert metric_points(client, job["id"], "scale") == [(step, 1.0) for step in range(STEPS) if step != 5]
        assert metric_points(client, job["id"], "lr") == [(step, 0.1) for step in range(STEPS)]
        listed = [i["path"] for i in client.get(f"/v1/jobs/{job['id']}/artifacts").json()["items"]]
        assert "workdir/mlflow.db" in listed
        got = client.get(f"/v1/jobs/{job['id']}/artifacts/workdir/mlflow.db")
        assert got.status_code == 200 and got.content.startswith(b"SQLite format 3\x00")
