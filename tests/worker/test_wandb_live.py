"""Scripts that log to Weights & Biases, unchanged, as 2-rank CPU script jobs given no W&B key: ``wandb.init()``
would fail without one ("No API key configured"); the job runs it offline, its logged values are the job's
metrics (one that diverged a gap), and the offline run is in its artifacts for ``wandb sync``. A plain ``wandb.init``/``wandb.log`` DDP
script, and Lightning's WandbLogger, whose values are at Lightning's own global step (its ``define_metric``)."""

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

PLAIN = ddp_regression("wandb", begin='wandb.init(project="regression", config={"lr": 0.1, "steps": 20})', log='''
    # A value that diverged for a step is a gap in its curve; the job and its other values go on.
    wandb.log({"train/loss": loss.item(), "lr": 0.1, "scale": float("nan") if step == 5 else 1.0})
''', end="wandb.finish()")

LIGHTNING = lightning_logging("from lightning.pytorch.loggers import WandbLogger\n", 'WandbLogger(project="lit")')


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


def test_scripts_logging_to_wandb_run_offline_and_their_values_are_the_jobs_metrics(services: Services) -> None:
    wandb = pytest.importorskip("wandb")
    lightning = pytest.importorskip("lightning")
    with plain_and_lightning_jobs(services, PLAIN, LIGHTNING, wandb, lightning) as (client, jobs):
        # Every value the script logged, at wandb's step, and the offline run in the artifacts.
        plain = jobs["plain"]
        assert_the_plain_scripts_metrics(client, plain)
        listed = [i["path"] for i in client.get(f"/v1/jobs/{plain['id']}/artifacts").json()["items"]]
        (run_file,) = [p for p in listed if p.startswith("workdir/wandb/offline-run-") and p.endswith(".wandb")]
        got = client.get(f"/v1/jobs/{plain['id']}/artifacts/{run_file}")
        assert got.status_code == 200 and got.content.startswith(b":W&B")

        # Lightning logs every 2nd step at its global step (wandb's own counter would count the calls, 0..5).
        lit = metric_points(client, jobs["lit"]["id"], "train_loss")
        assert [step for step, _ in lit] == list(range(1, LOGGED_STEPS, 2))
        assert metric_points(client, jobs["lit"]["id"], "epoch") == [(step, step // 4) for step in range(1, LOGGED_STEPS, 2)]
