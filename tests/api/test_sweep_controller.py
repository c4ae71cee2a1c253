"""The sweep controller over real SQL and Redis, with the scheduler's and supervisors' side played by the test: a
queued job that holds nothing starts, a running job asked to stop goes back in line, rank 0's metrics are ingested."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from redis import Redis
from sqlmodel import select

from jobs.settings import Settings
from jobs.store.models import Job, Status
from jobs.store.states import requeue, transition
from jobs.sweeps import controller
from jobspec.exit_codes import PAUSED_PHASE
from tests.api.conftest import finish_job, ingest, mlp_spec, session_of, start_job
from worker.executors.base import Phase, RankState
from worker.verdicts import Facts, Stop, Why, judge

LRS = [0.3, 0.1, 0.03, 0.01, 0.003, 0.001, 0.0003, 0.0001, 3.0]
BEST_LR = 0.01


def loss(lr: float, step: int) -> float:
    # A learning curve whose every point ranks the trials the same way: best at lr 0.01.
    from math import log10

    return (1 + abs(log10(lr) - log10(BEST_LR))) * (1 + 10 / step)


class World:
    """The scheduler and the supervisors, reduced to what a sweep sees of them."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.seq: dict[str, int] = {}

    def controller(self) -> None:
        # A fresh session each pass: the same as a controller that restarted between passes.
        with session_of(self.settings) as session:
            controller.run_pass(session, Redis.from_url(self.settings.redis_url), self.settings)

    def jobs(self) -> list[Job]:
        with session_of(self.settings) as s:
            return list(s.exec(select(Job).order_by(Job.id)).all())  # type: ignore[arg-type]

    def step(self, lr_of: dict[str, float], steps: int = 10, end_cancels: bool = True) -> None:
        for job in self.jobs():
            if job.status == Status.QUEUED.value and job.hold is None:
                start_job(self.settings, job.id)
            elif job.status == Status.RUNNING.value and job.stop_request:
                with session_of(self.settings) as s:
                    transition(s, job.id, Status.QUEUED, expect=[Status.RUNNING], reason=job.stop_request,
                               values={"stop_request": None, "waiting_reason": job.stop_request})
            elif job.status == Status.RUNNING.value:
                at = (job.last_step or 0) + steps
                self.seq[job.id] = self.seq.get(job.id, 0) + 1
                ingest(self.settings, job.id, [{"seq": self.seq[job.id], "time": 1.0, "type": "metric", "step": at,
                                                "epoch": 0, "values": {"eval/loss": loss(lr_of[job.id], at)}}])
                if at >= job.spec["train"]["max_steps"]:
                    finish_job(self.settings, job.id)
            elif job.status == Status.CANCELLING.value and end_cancels:
                finish_job(self.settings, job.id, Status.CANCELLED, reason="stopped")


def asha_sweep(**overrides: Any) -> dict[str, Any]:
    body = {"name": "lr-asha", "spec": mlp_spec(parallel={"nproc_per_node": 1}), "method": "asha", "metric": "eval/loss",
            "mode": "min", "max_trials": 9, "max_concurrent_trials": 3,
            "asha": {"min_resource": 10, "reduction_factor": 3, "rungs": 3, "sampler": "grid"},
            "space": {"train.lr": {"type": "choice", "values": LRS}}}
    body.update(overrides)
    return body


def test_asha_pauses_at_rungs_promotes_the_best_and_stops_the_rest(client: TestClient, settings: Settings) -> None:
    sweep_id = client.post("/v1/sweeps", json=asha_sweep()).json()["id"]
    world = World(settings)
    lr_of: dict[str, float] = {}
    most_active = 0
    for _ in range(200):
        world.controller()
        detail = client.get(f"/v1/sweeps/{sweep_id}").json()
        lr_of.update({t["job_id"]: t["params"]["train.lr"] for t in detail["trials"] if t["job_id"]})
        active = [j for j in world.jobs() if j.status in ("queued", "running") and j.hold is None]
        most_active = max(most_active, len(active))
        if detail["status"] != "running":
            break
        world.step(lr_of)
    assert detail["status"] == "succeeded", detail
    assert most_active <= 3  # never more than max_concurrent_trials placed or waiting to be
    trials = detail["trials"]
    assert detail["best_params"] == {"train.lr": BEST_LR}
    by_state: dict[str, list[int]] = {}
    for t in trials:
        by_state.setdefault(t["state"], []).append(t["number"])
    # Nine reach rung 0, three go on to rung 1, one to the last rung (90 steps); six stop at rung 0, two at rung 1.
    assert sorted(len(v) for v in by_state.values()) == [1, 8], by_state
    assert [t["rung"] for t in trials].count(0) == 6 and [t["rung"] for t in trials].count(1) == 2
    winner = next(t for t in trials if t["state"] == "succeeded")
    assert winner["params"]["train.lr"] == BEST_LR and winner["last_step"] == 90
    for t in trials:
        job = client.get(f"/v1/jobs/{t['job_id']}").json()
        if t["state"] == "stopped":
            assert job["status"] == "cancelled"
            assert job["error"]["type"] == "early_stopped", job["error"]
            assert any(tr["reason"].startswith("early_stopped: sweep lr-asha: not among the best 1/3")
                       for tr in job["transitions"]), job["transitions"]
        # A paused trial went back in line without a new attempt, and its steps continue where they stopped.
        assert job["attempt"] == 1


def test_a_second_controller_promotes_and_submits_nothing_twice(client: TestClient, settings: Settings) -> None:
    sweep_id = client.post("/v1/sweeps", json=asha_sweep(max_concurrent_trials=9)).json()["id"]
    world = World(settings)
    world.controller()
    lr_of = {t["job_id"]: t["params"]["train.lr"] for t in client.get(f"/v1/sweeps/{sweep_id}").json()["trials"]}
    world.step(lr_of)
    world.step(lr_of)  # every trial at step 10: rung 0
    world.controller()  # pauses all nine
    world.step(lr_of)  # each goes back in line, held
    for _ in range(3):  # passes of a standby that took over, and of the old leader, each from the stored state
        world.controller()
    detail = client.get(f"/v1/sweeps/{sweep_id}").json()
    assert len(world.jobs()) == 9
    assert sorted(t["state"] for t in detail["trials"]) == ["running"] * 3 + ["stopped"] * 6
    assert sorted(t["allowed_rung"] for t in detail["trials"]) == [0] * 6 + [1] * 3
    assert {t["params"]["train.lr"] for t in detail["trials"] if t["state"] == "running"} == {0.03, 0.01, 0.003}
    # Promoted: released; stopped: cancelled. Nothing waits held.
    assert [j.id for j in world.jobs() if j.hold is not None and j.status != "cancelled"] == []


def test_brackets_start_later_rungs_and_rank_their_own_trials(client: TestClient, settings: Settings) -> None:
    # Two brackets over rungs at 10, 30 and 90 steps: even trials start at rung 0, odd ones at rung 1 (their first
    # pause is at step 30), and each bracket trains its own best to the end.
    body = asha_sweep()
    body["asha"] = {**body["asha"], "brackets": 2}
    sweep_id = client.post("/v1/sweeps", json=body).json()["id"]
    world = World(settings)
    lr_of: dict[str, float] = {}
    first_pause: dict[int, int] = {}
    for _ in range(200):
        world.controller()
        detail = client.get(f"/v1/sweeps/{sweep_id}").json()
        lr_of.update({t["job_id"]: t["params"]["train.lr"] for t in detail["trials"] if t["job_id"]})
        for t in detail["trials"]:
            if t["state"] == "paused":
                first_pause.setdefault(t["number"], t["allowed_rung"])
        if detail["status"] != "running":
            break
        world.step(lr_of)
    assert detail["status"] == "succeeded", detail
    trials = detail["trials"]
    assert [t["bracket"] for t in trials] == [n % 2 for n in range(9)]
    assert all(rung >= n % 2 for n, rung in first_pause.items()) and any(first_pause[n] == 1 for n in first_pause if n % 2)
    for t in trials:
        assert all(int(k) >= t["bracket"] for k in t["rung_values"]), t
    # One trial of each bracket reaches the last rung; the best of them is the best learning rate (odd, bracket 1).
    finished = [t for t in trials if t["state"] == "succeeded"]
    assert sorted(t["bracket"] for t in finished) == [0, 1], finished
    assert detail["best_params"] == {"train.lr": BEST_LR}
    stopped = next(t for t in trials if t["state"] == "stopped" and t["bracket"] == 1)
    job = client.get(f"/v1/jobs/{stopped['job_id']}").json()
    assert any("not among the best 1/3 of bracket 1 at rung 1" in tr["reason"] for tr in job["transitions"]), job["transitions"]


def test_a_sweep_ends_only_once_its_stopped_trials_jobs_have_ended(client: TestClient, settings: Settings) -> None:
    sweep_id = client.post("/v1/sweeps", json=asha_sweep(max_trials=3, asha={
        "min_resource": 10, "reduction_factor": 3, "rungs": 2, "sampler": "grid"})).json()["id"]
    world = World(settings)
    lr_of: dict[str, float] = {}
    for _ in range(50):
        world.controller()
        lr_of.update({t["job_id"]: t["params"]["train.lr"] for t in client.get(f"/v1/sweeps/{sweep_id}").json()["trials"]})
        jobs = world.jobs()
        if len(jobs) == 3 and all(j.status in ("succeeded", "cancelling") for j in jobs):
            break
        world.step(lr_of, end_cancels=False)  # the stopped trials' jobs are still checkpointing
    world.controller()
    detail = client.get(f"/v1/sweeps/{sweep_id}").json()
    assert sorted(t["state"] for t in detail["trials"]) == ["stopped", "stopped", "succeeded"]
    assert detail["status"] == "running"  # every trial decided, but two jobs still hold their devices
    world.step(lr_of)  # their cancels end
    world.controller()
    assert client.get(f"/v1/sweeps/{sweep_id}").json()["status"] == "succeeded"


def test_a_trial_that_pauses_by_itself_after_its_promotion_trains_on(client: TestClient, settings: Settings) -> None:
    # The pass sees rung 0 while the attempts still save their checkpoints: it pauses both, promotes the better and
    # releases it. Then that attempt ends as it was launched to, paused at rung 0, and its verdict holds the job.
    sweep_id = client.post("/v1/sweeps", json=asha_sweep(max_trials=2, max_concurrent_trials=2, asha={
        "min_resource": 10, "reduction_factor": 2, "rungs": 3, "sampler": "grid"})).json()["id"]
    world = World(settings)
    world.controller()
    lr_of = {t["job_id"]: t["params"]["train.lr"] for t in client.get(f"/v1/sweeps/{sweep_id}").json()["trials"]}
    world.step(lr_of)
    world.step(lr_of)  # both at step 10, still running
    world.controller()
    (promoted,) = [t for t in client.get(f"/v1/sweeps/{sweep_id}").json()["trials"] if t["allowed_rung"] == 1]
    verdict = judge(Stop(Why.EXITED, exit_code=0, state=RankState(Phase.EXITED, 0)),
                    Facts(attempt=1, max_attempts=1, last_phase=PAUSED_PHASE, pause_at="steps:10"))
    with session_of(settings) as s:
        requeue(s, promoted["job_id"], reason=verdict.reason, spend_retry=False, values=dict(verdict.values),
                preempted=True)
    assert next(j for j in world.jobs() if j.id == promoted["job_id"]).hold is not None
    world.controller()
    assert next(j for j in world.jobs() if j.id == promoted["job_id"]).hold is None  # in line again, not held for good
    for _ in range(50):
        world.step(lr_of)
        world.controller()
        detail = client.get(f"/v1/sweeps/{sweep_id}").json()
        if detail["status"] != "running":
            break
    assert detail["status"] == "succeeded", detail
    winner = next(t for t in detail["trials"] if t["number"] == promoted["number"])
    assert winner["state"] == "succeeded" and winner["last_step"] == 40, winner
