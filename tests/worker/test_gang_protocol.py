"""The gang protocol's pieces without torchrun: the per-node torchrun command, the assembling lock
(one gang at a time), and an aborted round that gives everything back."""

from __future__ import annotations

from pathlib import Path

from redis import Redis
from rq import Queue

from jobs import gang as keys
from jobs import queue
from jobs.models import Job
from jobs.settings import Settings
from tests.conftest import make_settings
from trainer.spec import spec_from_dict
from worker.gang import ABORT, Leader, Round, node_launch
from worker.launch import torchrun_command, torchrun_env
from worker.processes import NODE_MARK

SPEC = {"name": "g", "model": {"name": "mlp"}, "data": {"name": "synthetic-classification"},
        "parallel": {"nnodes": 2, "nproc_per_node": 2}}


def gang_settings(tmp_path: Path, redis_url: str) -> Settings:
    return make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", redis_url, worker_host="127.0.0.1",
                         gang_assemble_timeout_s=0.5, lease_ttl_s=3.0)


def test_node_command_joins_the_c10d_rendezvous_and_single_node_stays_standalone(tmp_path: Path, redis_url: str) -> None:
    settings = gang_settings(tmp_path, redis_url)
    spec = spec_from_dict(SPEC)
    node = node_launch(settings, "job1", 3, 2, 1, "127.0.0.1:29555")
    cmd = torchrun_command(spec, tmp_path, 3, settings, node=node)
    assert "--standalone" not in cmd
    for arg in ("--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29555",
                "--rdzv-id=job1-a3", "--local-addr=127.0.0.1", "--nproc-per-node=2"):
        assert arg in cmd
    assert "is_host=false" in next(a for a in cmd if a.startswith("--rdzv-conf="))
    env = torchrun_env("job1", 3, tmp_path, settings, spec, node=node)
    assert env[NODE_MARK] == "1" and env["TORCHELASTIC_ERROR_FILE"].endswith("error-node-1.json")
    single = torchrun_command(spec, tmp_path, 3, settings)
    assert "--standalone" in single and "--nnodes=1" in single and not any(a.startswith("--rdzv") for a in single)
    assert NODE_MARK not in torchrun_env("job1", 3, tmp_path, settings, spec)


def test_one_gang_assembles_at_a_time_and_an_aborted_round_gives_everything_back(tmp_path: Path, redis_url: str) -> None:
    settings = gang_settings(tmp_path, redis_url)
    redis = Redis.from_url(redis_url)
    first, second = (Job(id=f"job{i}", owner="o", name="g", spec=SPEC, queue="default") for i in (1, 2))
    a = Leader(redis, settings, first, 3, "w0")
    b = Leader(redis, settings, second, 2, "w1")
    assert a.lock() and not b.lock()
    assert keys.assembling(redis, "job1", 1) and not keys.assembling(redis, "job2", 1)

    # Nobody joins: the round aborts, its follower tasks leave the queue, the lock is free again.
    assert not a.assemble(lambda: True)
    assert Round(redis, "job1", 1, a.nonce, 3, 3).state()[0] == ABORT
    assert Queue("default", connection=redis).job_ids == []
    assert b.lock()
    b.release()

    # A re-offer waits under a fresh id that queue_position follows.
    assert queue.reoffer(redis, first)
    assert queue.current_rq_id(redis, first).startswith("job1-a1-o")
    assert queue.queue_position(redis, first) == 0 and queue.is_waiting(redis, first)
