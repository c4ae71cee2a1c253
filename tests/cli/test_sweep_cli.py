"""``torchyard sweep SPEC --follow`` and ``torchyard sweeps`` against a real API, the trials played through by the
test (the controller's pass in-process, the jobs' progress written as a supervisor would)."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import yaml

from tests.api.conftest import mlp_spec
from tests.api.test_sweep_controller import LRS, World
from tests.cli.conftest import cli
from tests.helpers import Services


def play(services: Services, stop: threading.Event) -> None:
    """Pass and progress until every sweep has finished (or the test gives up)."""
    world = World(services.settings)
    with services.client() as client:
        while not stop.is_set():
            world.controller()
            sweeps = client.get("/v1/sweeps").json()["items"]
            if sweeps and all(s["status"] != "running" for s in sweeps):
                return
            lr_of = {t["job_id"]: t["params"]["train.lr"] for s in sweeps
                     for t in client.get(f"/v1/sweeps/{s['id']}").json()["trials"] if t["job_id"]}
            world.step(lr_of)


def test_sweep_follow_prints_trials_and_the_best_parameters(services: Services, tmp_path: Path) -> None:
    services.start_api()
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(mlp_spec(parallel={"nproc_per_node": 1})))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({
        "name": "lr-asha", "spec": "job.yaml", "method": "asha", "metric": "eval/loss", "max_trials": 9,
        "max_concurrent_trials": 3, "asha": {"min_resource": 10, "reduction_factor": 3, "rungs": 3, "sampler": "grid"},
        "space": {"train.lr": {"type": "choice", "values": LRS}}}))
    stop = threading.Event()
    player = threading.Thread(target=play, args=(services, stop), daemon=True)
    player.start()
    try:
        code, out = cli(services, "sweep", str(tmp_path / "sweep.yaml"), "--follow")
    finally:
        stop.set()
        player.join(timeout=30)
    assert code == 0, out
    assert "9 trials, 3 at a time" in out
    # Each trial as its state changes (the follow polls every 2 s: the quickest steps of this played sweep fall
    # between two polls), then the table and the best parameters.
    assert "trial 3 [train.lr=0.01]: " in out
    assert "trial 8 [train.lr=3]: stopped early at rung 0 (step 10), eval/loss 6.954" in out
    assert "best parameters: train.lr=0.01" in out, out
    sweep_id = httpx.get(f"{services.url}/v1/sweeps", headers=services.headers).json()["items"][0]["id"]
    code, out = cli(services, "sweeps")
    assert code == 0 and sweep_id in out and "succeeded" in out
    code, out = cli(services, "sweeps", "show", sweep_id)
    assert code == 0 and "best parameters: train.lr=0.01" in out and out.count("stopped") == 8
    code, out = cli(services, "sweeps", "cancel", sweep_id)
    assert code == 4 and "already succeeded" in out


def test_a_bad_sweep_file_names_the_field(services: Services, tmp_path: Path) -> None:
    services.start_api()
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump({
        "name": "bad", "spec": mlp_spec(), "method": "grid", "metric": "eval/loss",
        "space": {"train.lr": {"type": "choice", "values": [0.1, 50.0]}}}))
    code, out = cli(services, "sweep", str(tmp_path / "sweep.yaml"))
    assert code == 4 and "space.train.lr" in out, out


def _trial(number: int, bracket: int | None, rung: int | None) -> dict[str, object]:
    return {"number": number, "state": "paused", "bracket": bracket, "rung": rung, "last_step": 30, "last_value": 0.5,
            "best_value": 0.5, "job_id": f"job-{number}", "params": {"train.lr": 0.01 * (number + 1)}}


def _rendered(sweep: dict[str, object]) -> list[str]:
    from rich.console import Console

    from torchyard.cli.sweep import trials_table

    console = Console(width=200, record=True)
    console.print(trials_table(sweep))
    return console.export_text().splitlines()


def test_the_trials_table_names_each_trials_bracket_where_a_sweep_has_several() -> None:
    """With asynchronous Hyperband a trial is ranked only within its bracket: the table says which one."""
    lines = _rendered({"metric": "eval/loss", "best_trial": 1,
                       "trials": [_trial(0, 0, 0), _trial(1, 1, 1), _trial(2, 2, 2)]})
    assert lines[0].split() == ["TRIAL", "STATE", "BRACKET", "RUNG", "STEP", "EVAL/LOSS", "BEST", "JOB", "PARAMS"]
    assert lines[2].split()[:5] == ["1", "*", "paused", "1", "1"]
    assert lines[3].split()[:4] == ["2", "paused", "2", "2"]
    plain = _rendered({"metric": "eval/loss", "trials": [_trial(0, None, None), _trial(1, None, None)]})
    assert "BRACKET" not in plain[0] and plain[0].split()[:3] == ["TRIAL", "STATE", "RUNG"]


def test_follow_shows_the_value_a_trial_was_ranked_by_at_its_rung_not_its_latest() -> None:
    from torchyard.cli.sweep import _change

    trial = {**_trial(4, None, 0), "rung_values": {"0": 0.8123}, "last_value": 0.4, "last_step": 27}
    assert _change(trial, "eval/loss").endswith("paused at rung 0 (step 27), eval/loss 0.8123")
    assert _change({**trial, "state": "stopped"}, "eval/loss").endswith("stopped early at rung 0 (step 27), eval/loss 0.8123")
    # Running on, it shows what it reports now.
    assert _change({**trial, "state": "running"}, "eval/loss").endswith("running (step 27), eval/loss 0.4")
