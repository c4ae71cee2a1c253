"""``torchyard usage`` and ``Client.usage`` against a real API, over attempts written as a supervisor writes them."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

from jobs.store.models import Attempt
from tests.api.conftest import session_of, start_job
from tests.cli.conftest import cli
from tests.helpers import Services
from torchyard.client import Client


def test_usage_by_owner_and_day_as_a_table_csv_and_through_the_client(services: Services) -> None:
    services.start_api()
    (services.settings.code_dir / "train.py").write_text("pass\n")
    with services.client() as client:
        job_id = client.post("/v1/jobs", json={"kind": "script", "name": "u", "entrypoint": "train.py"}).json()["id"]
        key = client.headers["Authorization"].split()[-1]
    start_job(services.settings, job_id)
    # 2 GPUs for 3 hours, ending 10 days ago; a --since 7d window leaves it out.
    end = datetime.now(timezone.utc).replace(hour=12, minute=0, second=0, microsecond=0) - timedelta(days=10)
    with session_of(services.settings) as s:
        s.exec(sa.update(Attempt).where(Attempt.job_id == job_id).values(
            started_at=end - timedelta(hours=3), finished_at=end, outcome="succeeded",
            placement=[{"node_rank": 0, "host": "gpu-a", "gpus": [0, 1], "cpu_slots": 0}]))
        s.commit()

    code, out = cli(services, "usage", "--by", "owner,day")
    assert code == 0, out
    row = next(line.split() for line in out.splitlines() if line.startswith("admin"))
    assert row == ["admin", f"{end:%Y-%m-%d}", "6.00", "0.00", "1", "1", "0.00"], out
    code, out = cli(services, "usage", "--csv")
    assert code == 0 and out.splitlines() == ["owner,gpu_hours,cpu_slot_hours,jobs,attempts,preempted_gpu_hours",
                                              "admin,6.0,0.0,1,1,0.0"], out
    code, out = cli(services, "usage", "--since", "7d")
    assert code == 0 and "no attempt held a GPU or CPU slot in that time" in out, out
    code, out = cli(services, "usage", "--since", "last tuesday")
    assert code == 2 and "--since" in out and "7d" in out, out

    with Client(services.url, key) as api:
        [usage] = api.usage(group_by="owner")
        assert (usage.owner, usage.gpu_hours, usage.jobs) == ("admin", 6.0, 1)
        assert api.usage(start=datetime.now(timezone.utc) - timedelta(days=7)) == []
