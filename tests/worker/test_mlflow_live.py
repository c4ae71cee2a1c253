"""Scripts that log to MLflow with no tracking server set, unchanged, as 2-rank CPU script jobs: a plain DDP script,
whose MLflow writes its default store (``mlflow.db`` in the working directory), and Lightning's MLFlowLogger, which
writes the file store (``mlruns/``). What they logged is the job's metrics, at the steps they gave, a series logged
without a step numbered by order, a value that diverged a gap; the store itself is in the job's artifacts for
``mlflow ui --backend-store-uri sqlite:///mlflow.db``."""

from __future__ import annotations

import pytest

from tests.helpers import Services
from tests.worker.frameworks import (
    LOGGED_STEPS,
    assert_the_plain_scripts_metrics,
    ddp_regression,
    lightning_logging,
    metric_points,
    plain_and_lightning_jobs,
)

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


# Lightning's MLFlowLogger() writes MLflow's file store (file:./mlruns), which MLflow 3.17 refuses unless told to
# allow it; with MLflow 2 a script needs nothing of the kind.
LIGHTNING = lightning_logging('''
    import os
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from lightning.pytorch.loggers import MLFlowLogger
''', "MLFlowLogger()")


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_scripts_logging_to_mlflows_local_stores_have_their_values_as_the_jobs_metrics(services: Services) -> None:
    mlflow = pytest.importorskip("mlflow")
    lightning = pytest.importorskip("lightning")
    with plain_and_lightning_jobs(services, SCRIPT, LIGHTNING, mlflow, lightning) as (client, jobs):
        # The default store, mlflow.db: every value at the step it was logged with, or numbered by order without one.
        job = jobs["plain"]
        assert_the_plain_scripts_metrics(client, job)
        listed = [i["path"] for i in client.get(f"/v1/jobs/{job['id']}/artifacts").json()["items"]]
        assert "workdir/mlflow.db" in listed
        got = client.get(f"/v1/jobs/{job['id']}/artifacts/workdir/mlflow.db")
        assert got.status_code == 200 and got.content.startswith(b"SQLite format 3\x00")

        # Lightning's MLFlowLogger, the file store: every 2nd step at Lightning's global step.
        lit = metric_points(client, jobs["lit"]["id"], "train_loss")
        assert [step for step, _ in lit] == list(range(1, LOGGED_STEPS, 2))
