"""Sweeps: ASHA of 27 trials against running all 27 to the end (``python -m bench --only sweeps``).

Measured learning curves, simulated hosts. Each of the 27 trials (learning rate log-uniform in [1e-4, 0.3],
hidden width in {16, 64, 256}, drawn with the sweep's seeded sampler) is trained once to the full 810 steps
by the real trainer on the synthetic classification task (10 classes), evaluating every 10 steps. The two
searches are then replayed on simulated hosts (2 x 4 GPUs, one GPU per trial, 8 trials at a time), a step
costing one GPU-second and every launch (a start, or a resume from the checkpoint after a promotion) a fixed
overhead: the full search runs every trial to step 810; ASHA (eta 3, 4 rungs at 30, 90, 270 and 810 steps)
goes through ``jobs.sweeps.asha.decide`` exactly as the controller calls it, trials pausing at their rung,
reading their metric there from the measured curve, and resuming where they paused when promoted. The same
curves are replayed with a later first rung and with 2 to 4 brackets (asynchronous Hyperband). Every task is
trained under a constant learning rate and under a cosine schedule. Figures: GPU-hours, the simulated wall
clock, and the best final eval/accuracy each search finds.
"""

from __future__ import annotations

import heapq
import json
import logging
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import REPO, Ctx, bench_env
from jobs.sweeps.asha import TrialState, bracket_of, decide
from jobs.sweeps.sampling import params_of
from jobs.sweeps.spec import SweepSpec, trial_spec

log = logging.getLogger("bench")

CONFIG = {"trials": 27, "eta": 3, "rungs": 4, "min_resource": 30, "slots": 8, "hosts": "2 x 4 GPUs",
          "step_gpu_s": 1.0, "launch_overhead_s": 20.0, "metric": "eval/accuracy", "mode": "max", "seed": 7,
          "goals": {"gpu_hours_ratio": 3.0, "best_within": 0.01}}
# Two variants of the synthetic classification task: the harder one learns slowly (its early rungs say little
# about the end), the easier one the slow tests use.
# A second ASHA on the same curves, its first rung three times later (fewer, longer rungs): what the search
# gives when the early rungs of the first say little about the end.
LATE_START = {"min_resource": 90, "rungs": 3}
TASKS = {"10 classes": {"samples": 4096, "features": 32, "classes": 10, "eval_samples": 2048},
         "4 classes": {"samples": 2048, "features": 16, "classes": 4, "eval_samples": 1024}}
# Each task under two of the trainer's learning-rate schedules: constant (the spec's default) and cosine to zero
# over the trial's steps (a trial's max_steps is the last rung's resource, so a paused and promoted trial follows
# the same schedule as one trained straight through). With a constant rate the fast starters lead early and then
# stall, so the early rungs rank trials nearly at random; an annealing rate is what a search over learning rates
# is normally run with.
SCHEDULES = ("constant", "cosine")


def sweep_spec(task: dict[str, Any] | None = None, min_resource: int | None = None, rungs: int | None = None,
               brackets: int = 1, schedule: str = "constant") -> SweepSpec:
    return SweepSpec.model_validate({
        "name": "bench", "method": "asha", "metric": CONFIG["metric"], "mode": CONFIG["mode"], "max_trials": CONFIG["trials"],
        "max_concurrent_trials": CONFIG["slots"], "seed": CONFIG["seed"],
        "asha": {"min_resource": min_resource or CONFIG["min_resource"], "reduction_factor": CONFIG["eta"],
                 "rungs": rungs or CONFIG["rungs"], "brackets": brackets},
        "space": {"train.lr": {"type": "loguniform", "low": 1e-4, "high": 0.3},
                  "model.args.hidden": {"type": "choice", "values": [16, 64, 256]}},
        "spec": {"name": "bench", "model": {"name": "mlp"}, "parallel": {"nproc_per_node": 1, "device": "cpu"},
                 "data": {"name": "synthetic-classification", "args": task or TASKS["10 classes"]},
                 "train": {"epochs": 100, "global_batch_size": 32, "schedule": {"name": schedule}},
                 "checkpoint": {"every_steps": 100000}},
    })


def curve(work: Path, sweep: SweepSpec, n: int) -> dict[int, float]:
    """Trial ``n`` trained to the last rung by the real trainer (one process): its metric at every evaluation."""
    run_dir = work / f"trial-{n}"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = trial_spec(sweep, params_of(sweep, n), "bench", n)
    (run_dir / "spec.json").write_text(json.dumps(spec))
    subprocess.run([sys.executable, "-m", "trainer", "--spec", str(run_dir / "spec.json"), "--run-dir", str(run_dir)],
                   env=bench_env(), cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    points = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event.get("type") == "metric" and CONFIG["metric"] in event.get("values", {}):
            points[int(event["step"])] = float(event["values"][CONFIG["metric"]])
    return points


def at(points: dict[int, float], step: int) -> float:
    return points[max(s for s in points if s <= step)]


def full_search(curves: list[dict[int, float]], sweep: SweepSpec) -> dict[str, Any]:
    assert sweep.asha is not None
    top = sweep.asha.max_resource
    per_trial = top * CONFIG["step_gpu_s"] + CONFIG["launch_overhead_s"]
    waves = -(-len(curves) // CONFIG["slots"])
    finals = [at(c, top) for c in curves]
    return {"gpu_hours": len(curves) * per_trial / 3600, "wall_h": waves * per_trial / 3600, "best": max(finals),
            "best_trial": finals.index(max(finals)), "steps": len(curves) * top, "launches": len(curves)}


def asha_search(curves: list[dict[int, float]], sweep: SweepSpec) -> dict[str, Any]:
    """Event-driven replay: running trials advance to their allowed rung, pause there, and the policy decides."""
    assert sweep.asha is not None
    a = sweep.asha
    step = {n: 0 for n in range(len(curves))}
    allowed = {n: bracket_of(n, a.brackets) for n in range(len(curves))}
    values: dict[int, dict[int, float]] = {n: {} for n in range(len(curves))}
    ended: set[int] = set()
    paused: set[int] = set()
    running: list[tuple[float, int]] = []  # (time it reaches its target, trial)
    now, gpu_s, created, launches = 0.0, 0.0, 0, 0

    def launch(n: int) -> None:
        nonlocal gpu_s, launches
        work = (a.resource_at(allowed[n]) - step[n]) * CONFIG["step_gpu_s"] + CONFIG["launch_overhead_s"]
        gpu_s += work
        launches += 1
        heapq.heappush(running, (now + work, n))

    while True:
        free = CONFIG["slots"] - len(running)
        states = [TrialState(n, dict(values[n]), allowed[n], paused=n in paused, ended=n in ended) for n in range(created)]
        d = decide(states, eta=a.reduction_factor, rungs=a.rungs, mode=sweep.mode, all_created=created >= len(curves),
                   free_slots=free, brackets=a.brackets)
        for n, rung in d.promote:
            paused.discard(n)
            allowed[n] = rung + 1
            launch(n)
        for n in d.stop:
            paused.discard(n)
            ended.add(n)
        while len(running) < CONFIG["slots"] and created < len(curves):
            launch(created)
            created += 1
        if not running:
            break
        now, n = heapq.heappop(running)
        step[n] = a.resource_at(allowed[n])
        values[n][allowed[n]] = at(curves[n], step[n])
        (ended if allowed[n] == a.rungs - 1 else paused).add(n)
    finished = {n: v[a.rungs - 1] for n, v in values.items() if a.rungs - 1 in v}
    best_trial = max(finished, key=lambda n: finished[n])
    return {"gpu_hours": gpu_s / 3600, "wall_h": now / 3600, "best": finished[best_trial], "best_trial": best_trial,
            "steps": sum(step.values()), "launches": launches, "reached_last_rung": len(finished),
            "stopped_by_rung": {str(r): sum(1 for n in range(len(curves)) if n not in finished and max(values[n]) == r)
                                for r in range(a.rungs - 1)},
            "best_bracket": bracket_of(best_trial, a.brackets)}


def spearman(xs: list[float], ys: list[float]) -> float:
    """Rank correlation (ties broken by order): how well a rung's ranking predicts the final one."""
    def ranks(v: list[float]) -> list[int]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0] * len(v)
        for r, i in enumerate(order):
            out[i] = r
        return out

    rx, ry, n = ranks(xs), ranks(ys), len(xs)
    return 1 - 6 * sum((a - b) ** 2 for a, b in zip(rx, ry, strict=True)) / (n * (n * n - 1))


def sweeps(ctx: Ctx) -> dict[str, Any]:
    out: dict[str, Any] = {"config": CONFIG, "tasks": {}}
    variants = [(name, task, schedule) for name, task in TASKS.items() for schedule in SCHEDULES]
    for name, task, schedule in (variants[:1] if ctx.quick else variants):
        label = name if schedule == "constant" else f"{name}, {schedule} lr"
        res = out["tasks"][label] = search(ctx.work / "sweeps" / label.replace(" ", "-").replace(",", ""),
                                           sweep_spec(task, schedule=schedule))
        res["data"], res["schedule"] = task, schedule
        curves = [{int(k): v for k, v in res["curves"][str(n)].items()} for n in range(CONFIG["trials"])]
        res["asha_late_start"] = {**replay(curves, sweep_spec(task, **LATE_START, schedule=schedule), res["full"]),
                                  **LATE_START}
        # Asynchronous Hyperband on the same curves: every bracket count the rungs allow (1 is the ASHA above).
        res["asha_brackets"] = {str(b): replay(curves, sweep_spec(task, brackets=b, schedule=schedule), res["full"])
                                for b in range(2, CONFIG["rungs"] + 1)}
    return out


def replay(curves: list[dict[int, float]], sweep: SweepSpec, full: dict[str, Any]) -> dict[str, Any]:
    """One more ASHA replay on curves already measured, with its figures against the full search."""
    assert sweep.asha is not None
    got = asha_search(curves, sweep)
    top = sweep.asha.max_resource
    ranked = sorted(range(len(curves)), key=lambda n: -at(curves[n], top))
    return {**got, "gpu_hours full/asha": full["gpu_hours"] / got["gpu_hours"],
            "best gap": (full["best"] - got["best"]) / full["best"], "pick_rank_in_full": ranked.index(got["best_trial"]) + 1}


def search(work: Path, sweep: SweepSpec) -> dict[str, Any]:
    assert sweep.asha is not None
    with ThreadPoolExecutor(max_workers=2) as pool:  # two cores: two trainers at a time
        curves = list(pool.map(lambda n: curve(work, sweep, n), range(CONFIG["trials"])))
    full, asha = full_search(curves, sweep), asha_search(curves, sweep)
    top = sweep.asha.max_resource
    ranked = sorted(range(len(curves)), key=lambda n: -at(curves[n], top))
    result = {"full": full, "asha": asha,
              "ratios": {"gpu_hours full/asha": full["gpu_hours"] / asha["gpu_hours"],
                         "wall full/asha": full["wall_h"] / asha["wall_h"],
                         "best gap": (full["best"] - asha["best"]) / full["best"]},
              "asha_pick_rank_in_full": ranked.index(asha["best_trial"]) + 1,
              # How well each rung's ranking predicts the end (1: perfectly): ASHA's premise on this task.
              "rung_rank_correlation": {str(sweep.asha.resource_at(k)): spearman(
                  [at(c, sweep.asha.resource_at(k)) for c in curves], [at(c, top) for c in curves])
                  for k in range(sweep.asha.rungs - 1)},
              "params": {str(n): params_of(sweep, n) for n in range(len(curves))},
              "curves": {str(n): {str(k): v for k, v in sorted(c.items())} for n, c in enumerate(curves)}}
    log.info("sweeps: full %.2f GPU-h best %.4f; asha %.2f GPU-h best %.4f", full["gpu_hours"], full["best"],
             asha["gpu_hours"], asha["best"])
    return result
