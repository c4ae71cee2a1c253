"""One-shot GPU check of the trainer on one NVIDIA GPU (NCCL), with a CPU mode (gloo, tiny sizes) for its code paths.

    python bench/gpu.py --out DIR                 # CUDA: about 3 minutes on an H100; parts not started by --budget-s are skipped
    python bench/gpu.py --out DIR --device cpu    # the same parts on the CPU, a few steps each
    python bench/gpu.py --suite mfu --out DIR     # instead: the trainer before/after against a hand-written loop (gpu_mfu.py)

Measures: (1) the environment: torch and CUDA versions, device name, bf16 support, NCCL version, NVML's GPU count (and
worker.devices.gpu_indices where the worker's settings import); (2) ``torchrun --standalone --nproc-per-node=1 -m trainer``
on a gpt (6 x 384, seq 256, batch 32, 300 steps) under DDP fp32, DDP bf16 and FSDP2 bf16: steady samples/s from the
metric events' wall times, first and last train/loss, the sys/gpu_* metrics, train/mem_bytes (peak allocated), the exit
code; (3) the FSDP2 run again in its run directory with a larger max_steps: it must resume at the saved step and report
every later step once; (4) trainer.checkpoint.load_model of the final checkpoint on cuda and on cpu, one forward each.

Writes DIR/gpu.json (rewritten after every part), DIR/gpu.log (this log), DIR/logs.txt (every torchrun and child log)
and DIR/events.txt (each run's events). Only the standard library is imported here: torch, the trainer and NVML run
in child processes under timeouts, so a hang or a crash is recorded and the remaining parts still run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("bench.gpu")

REPO = Path(__file__).resolve().parent.parent
# cuda: examples/gpt-fsdp.yaml made larger so the GPU has work; cpu: just enough steps for a steady window.
SIZES: dict[str, dict[str, Any]] = {
    "cuda": {"model": {"n_layer": 6, "n_head": 6, "n_embd": 384, "block_size": 256}, "batch": 32, "samples": 4096,
             "steps": 300, "resume_steps": 400, "log_every": 10, "run_cap_s": 90, "child_cap_s": 60, "budget_s": 250},
    # GPT-2 small's width and depth: enough work per step that bf16's tensor cores, not the host, set the pace.
    "cuda-large": {"model": {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 512}, "batch": 16, "samples": 4096,
                   "steps": 150, "resume_steps": 200, "log_every": 10, "run_cap_s": 120, "child_cap_s": 60, "budget_s": 250},
    "cpu": {"model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32}, "batch": 8, "samples": 256,
            "steps": 40, "resume_steps": 60, "log_every": 5, "run_cap_s": 180, "child_cap_s": 90, "budget_s": 1200},
}
VARIANTS = (("ddp_fp32", "ddp", "fp32"), ("ddp_bf16", "ddp", "bf16"), ("fsdp_bf16", "fsdp", "bf16"))
GPU_METRICS = ("sys/gpu_util", "sys/gpu_mem_used", "sys/gpu_mem_total")


class Check:
    """The parts, their checks and failures; DIR/gpu.json is rewritten after every part so a killed run leaves its results."""

    def __init__(self, out: Path, device: str, budget_s: float, size: str | None = None):
        self.out, self.device, self.size = out, device, SIZES[size or device]
        self.deadline = time.monotonic() + budget_s
        self.work = Path(tempfile.mkdtemp(prefix="torchyard-gpu-"))  # run dirs stay out of DIR: checkpoints must not come back
        self.results: dict[str, Any] = {"device": device, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "size": self.size,
                                        "work_dir": str(self.work), "parts": {}, "failures": []}
        for name in ("logs.txt", "events.txt"):
            (out / name).unlink(missing_ok=True)

    def save(self) -> None:
        self.results["ok"] = not self.results["failures"]
        (self.out / "gpu.json").write_text(json.dumps(self.results, indent=1, default=str))

    def timeout(self, cap: float) -> float:
        return max(1.0, min(cap, self.deadline - time.monotonic()))

    def part(self, name: str, fn: Callable[..., dict[str, Any]], *args: Any) -> None:
        """Run one part; an exception or a failed check is recorded and the next part still runs."""
        started = time.monotonic()
        log.info("%s ...", name)
        if self.deadline - started < 10:
            result: dict[str, Any] = {"skipped": "out of time (--budget-s)"}
            self.results["failures"].append(f"{name}: skipped, out of time")
        else:
            try:
                result = fn(*args)
            except Exception as exc:  # noqa: BLE001 - every part runs whatever the one before did; the traceback is kept
                result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
                self.results["failures"].append(f"{name}: {type(exc).__name__}: {exc}")
            except BaseException:  # SIGTERM (the outer timeout) or Ctrl-C: recorded, then the script unwinds
                self.results["parts"][name] = {"error": "interrupted", "part_s": round(time.monotonic() - started, 1)}
                self.results["failures"].append(f"{name}: interrupted")
                raise
            self.results["failures"] += [f"{name}: check {c} failed" for c, ok in (result.get("checks") or {}).items() if ok is False]
            result["part_s"] = round(time.monotonic() - started, 1)
        self.results["parts"][name] = result
        self.save()

    def append(self, name: str, title: str, text: str) -> None:
        with (self.out / name).open("a", encoding="utf-8") as f:
            f.write(f"\n===== {title} =====\n{text}\n")

    def env(self) -> dict[str, str]:
        """The children's environment: the repo importable ahead of what PYTHONPATH has (the wheels), no service settings."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHYARD_")}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
        env["TORCHYARD_LOG_LEVEL"] = "INFO"  # the resume line ("resumed from step_... (step N)") is logged at INFO
        if self.device == "cpu":
            env["OMP_NUM_THREADS"] = "1"
        return env

    def child(self, what: str, *args: str) -> dict[str, Any]:
        """This script in child mode (torch is imported there, never here); its last stdout line is its JSON answer."""
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", what, "--device", self.device, *args]
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=self.env(), capture_output=True, text=True,
                                  timeout=self.timeout(self.size["child_cap_s"]))
        except subprocess.TimeoutExpired as exc:
            self.append("logs.txt", f"child {what} (timed out)", f"{exc.stdout or ''}\n{exc.stderr or ''}")
            raise RuntimeError(f"child {what} timed out after {exc.timeout:.0f}s") from None
        self.append("logs.txt", f"child {what} (exit {proc.returncode})", proc.stdout + proc.stderr)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"child {what} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
        return json.loads(lines[-1])

    def script(self, name: str, args: list[str], extra_env: dict[str, str], cap: float) -> subprocess.CompletedProcess[str]:
        """Another bench script (bench/NAME) to its end, its output kept in logs.txt."""
        proc = subprocess.run([sys.executable, str(REPO / "bench" / name), *args], cwd=REPO, env={**self.env(), **extra_env},
                              capture_output=True, text=True, timeout=self.timeout(cap))
        self.append("logs.txt", f"{name} (exit {proc.returncode})", proc.stdout + proc.stderr)
        return proc

    def torchrun(self, title: str, spec: dict[str, Any], run_dir: Path, extra_env: dict[str, str] | None = None,
                 cap: float | None = None, cwd: Path = REPO) -> dict[str, Any]:
        """One trainer launch to its end or its timeout; on a timeout or an interrupt its process group is stopped."""
        run_dir.mkdir(parents=True, exist_ok=True)
        (spec_path := self.work / f"{title}.json").write_text(json.dumps(spec))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
               "-m", "trainer", "--spec", str(spec_path), "--run-dir", str(run_dir)]
        log_path, launched, timed_out = self.work / f"{title}.log", time.time(), False
        with log_path.open("wb") as out:
            # A session of its own, so one killpg reaches torchrun and its rank (which also dies with torchrun).
            # cwd: `-m trainer` imports the trainer from there first, whatever PYTHONPATH says.
            proc = subprocess.Popen(cmd, cwd=cwd, env={**self.env(), **(extra_env or {})}, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                proc.wait(self.timeout(cap or self.size["run_cap_s"]))
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                if proc.poll() is None:
                    _stop_group(proc)
                text = log_path.read_text(errors="replace")
                self.append("logs.txt", f"torchrun {title} (exit {proc.returncode}{', timed out' if timed_out else ''})", text)
        r = {"exit_code": proc.returncode, "timed_out": timed_out, "launched": launched, "wall_s": round(time.time() - launched, 1)}
        return {**r, "log": text, "log_tail": text[-1500:] if proc.returncode else None}

    def spec(self, strategy: str, precision: str, max_steps: int) -> dict[str, Any]:
        s = self.size
        return {
            "name": f"gpu-{strategy}-{precision}",
            "model": {"name": "gpt", "args": {**s["model"], "dropout": 0.0}},
            "data": {"name": "synthetic-lm", "args": {"samples": s["samples"], "eval_samples": 64, "vocab_size": 256,
                                                      "seq_len": s["model"]["block_size"]}},
            "parallel": {"strategy": strategy, "nproc_per_node": 1, "device": self.device},
            # Constant LR after warm-up: the resume's larger max_steps leaves the schedule unchanged.
            "train": {"epochs": 1000, "max_steps": max_steps, "global_batch_size": s["batch"], "lr": 6e-4, "betas": [0.9, 0.95],
                      "weight_decay": 0.1, "grad_clip": 1.0, "precision": precision, "log_every_steps": s["log_every"],
                      "schedule": {"name": "constant", "warmup_steps": 10}},
            "eval": {"max_batches": 2},
            "checkpoint": {"keep_last": 2},
        }

    def environment(self) -> dict[str, Any]:
        facts = self.child("env")
        checks = {"cuda_available": facts.get("cuda_available") is True, "bf16_supported": facts.get("bf16_supported") is True,
                  "nccl_version": isinstance(facts.get("nccl_version"), list),
                  "nvml_count": isinstance(n := facts.get("nvml_count"), int) and n >= 1}
        # On the CPU these facts are errors by nature, not failures.
        facts["checks"] = {k: v if self.device == "cuda" else None for k, v in checks.items()}
        return facts

    def train(self, title: str, strategy: str, precision: str) -> dict[str, Any]:
        run = self.torchrun(title, self.spec(strategy, precision, self.size["steps"]), self.work / title)
        return self.analyse(title, self.work / title, run, 0, self.size["steps"])

    def resume(self) -> dict[str, Any]:
        first, steps, every = self.size["steps"], self.size["resume_steps"], self.size["log_every"]
        run_dir = self.work / "fsdp_bf16"
        if not (run_dir / "checkpoints" / "latest").is_file():
            raise RuntimeError("fsdp_bf16 left no checkpoint to resume from")
        run = self.torchrun("fsdp_bf16_resume", self.spec("fsdp", "bf16", steps), run_dir)
        r = self.analyse("fsdp_bf16_resume", run_dir, run, first, steps)
        events = _events(run_dir)  # both launches'
        training = [e for e in events if e.get("type") == "status" and e.get("phase") == "training"]
        reports = [e for e in events if e.get("type") == "metric" and "train/loss" in (e.get("values") or {})]
        steps_logged = [e["step"] for e in reports]
        before = [e["values"]["train/loss"] for e in reports if e["step"] <= first]
        line = next((x.strip() for x in run["log"].splitlines() if "resumed from" in x), None)
        r.update({"resumed_from_step": training[-1].get("resumed_from_step") if training else None, "resumed_log_line": line,
                  "checkpoint_steps": [e["step"] for e in events if e.get("type") == "checkpoint"],
                  "loss_steps_duplicated": sorted({s for s in steps_logged if steps_logged.count(s) > 1})})
        r["checks"].update({
            "resumed_at_saved_step": r["resumed_from_step"] == first,
            "resume_logged": line is not None and f"(step {first})" in line,
            "each_step_once": steps_logged == sorted(set(range(every, steps + 1, every)) | {first, steps}),
            # Restored weights: the loss goes on from where the first launch ended, not from the untrained model's.
            "loss_continues": bool(before) and r.get("loss_first") is not None
            and abs(r["loss_first"] - before[-1]) < abs(r["loss_first"] - before[0]),
        })
        return r

    def load(self) -> dict[str, Any]:
        # The resumed FSDP2 run's final checkpoint; another run's if that one left none.
        found = [d for d in ("fsdp_bf16", "ddp_bf16", "ddp_fp32") if (self.work / d / "checkpoints" / "latest").is_file()]
        if not found:
            raise RuntimeError("no run left a checkpoint")
        r = {"run": found[0], **self.child("load", "--run-dir", str(self.work / found[0]))}
        r["checks"] = {f"finite_{dev}": bool(f.get("finite")) for dev, f in r["forward"].items()}
        if "max_abs_diff_cuda_cpu" in r:
            r["checks"]["cuda_matches_cpu"] = r["max_abs_diff_cuda_cpu"] < 1e-2
        return r

    def analyse(self, title: str, run_dir: Path, run: dict[str, Any], start: int, steps: int) -> dict[str, Any]:
        """One launch's figures from its events (those written after it started), checked."""
        events = [e for e in _events(run_dir) if e.get("time", 0) >= run["launched"]]
        self.append("events.txt", title, "\n".join(json.dumps(e) for e in events))
        metrics = [e for e in events if e.get("type") == "metric" and "train/loss" in (e.get("values") or {})]
        phases = {e.get("phase"): e for e in events if e.get("type") == "status"}
        r: dict[str, Any] = {k: v for k, v in run.items() if k != "log"}
        r.update(done_step=phases.get("done", {}).get("step"), device_reported=phases.get("starting", {}).get("device"))
        if "training" in phases:  # launch -> training starts: imports, CUDA and NCCL init, model build, checkpoint load
            r["startup_s"] = round(phases["training"]["time"] - run["launched"], 1)
        if metrics:
            r.update(loss_first=metrics[0]["values"]["train/loss"], loss_last=metrics[-1]["values"]["train/loss"],
                     loss_steps=[metrics[0]["step"], metrics[-1]["step"]], metric_events=len(metrics),
                     gpu_metrics_in_events=sum(all(n in m["values"] for n in GPU_METRICS) for m in metrics),
                     util_max=max((m["values"]["sys/gpu_util"] for m in metrics if "sys/gpu_util" in m["values"]), default=None))
            r.update({n: metrics[-1]["values"].get(n) for n in ("train/mem_bytes", "train/mfu", "train/tokens_per_s", *GPU_METRICS)})
            # Steady state: from a quarter of the way in (CUDA warm-up and allocator growth done) to the last report.
            times = {m["step"]: m["time"] for m in metrics}
            window = sorted(s for s in times if s >= start + (steps - start) // 4)
            if len(window) >= 2:
                dt, n = times[window[-1]] - times[window[0]], window[-1] - window[0]
                r.update(samples_per_s=round(n * self.size["batch"] / dt, 1), step_ms=round(dt / n * 1e3, 2),
                         window=[window[0], window[-1]])
        cuda = self.device == "cuda"
        total, used, util, peak = r.get("sys/gpu_mem_total"), r.get("sys/gpu_mem_used"), r.get("util_max"), r.get("train/mem_bytes")
        r["checks"] = {
            "exit_0": run["exit_code"] == 0,
            "done_at_max_steps": r["done_step"] == steps,
            # A resumed launch starts near the loss floor, where 100 steps can go either way: it has loss_continues instead.
            "loss_decreased": r.get("loss_last") is not None and r["loss_last"] < r["loss_first"] if start == 0 else None,
            "steady_rate": r.get("samples_per_s", 0) > 0,
            "gpu_metrics_every_report": r.get("gpu_metrics_in_events") == r.get("metric_events") if cuda else None,
            "gpu_mem_plausible": bool(total and used and 1e9 < total < 1e12 and 0 < used <= total) if cuda else None,
            "gpu_util_plausible": util is not None and 0 < util <= 100 if cuda else None,
            "peak_alloc_plausible": bool(peak and total and 0 < peak < total) if cuda else None,
        }
        return r

    def table(self) -> None:
        parts, fmt = self.results["parts"], "%-17s %4s %9s %8s %16s %5s %11s %8s %6s %9s"
        env = parts.get("env", {})
        log.info("env: %s", {k: env.get(k) for k in ("device_name", "torch", "torch_cuda", "cuda_available", "bf16_supported",
                                                     "nccl_version", "nvml_count", "worker_gpu_indices")})
        log.info(fmt, "run", "exit", "samples/s", "step ms", "loss first->last", "util", "GiB use/tot", "peak GiB", "mfu", "start/wall")
        for name in [v[0] for v in VARIANTS] + ["fsdp_bf16_resume"]:
            r = parts.get(name, {})
            if "exit_code" not in r:
                log.info("%-17s %s", name, r.get("error") or r.get("skipped") or "not run")
                continue
            log.info(fmt, name, r["exit_code"], r.get("samples_per_s"), r.get("step_ms"),
                     f"{_f(r.get('loss_first'))}->{_f(r.get('loss_last'))}",
                     _f(r.get("util_max"), 0), f"{_gib(r.get('sys/gpu_mem_used'))}/{_gib(r.get('sys/gpu_mem_total'))}",
                     _gib(r.get("train/mem_bytes")), _f(r.get("train/mfu")), f"{r.get('startup_s')}/{r['wall_s']}")
        res, load = parts.get("fsdp_bf16_resume", {}), parts.get("load", {})
        log.info("resume: from step %s, checkpoints at %s, duplicated steps %s; log: %s", res.get("resumed_from_step"),
                 res.get("checkpoint_steps"), res.get("loss_steps_duplicated"), res.get("resumed_log_line"))
        log.info("load_model %s/%s: %s; cuda-cpu max abs diff %s", load.get("run"), load.get("checkpoint"),
                 load.get("error") or load.get("forward"), load.get("max_abs_diff_cuda_cpu"))
        for failure in self.results["failures"]:
            log.warning("FAILED %s", failure)
        log.info("%s: %d failure(s) in %.0fs; results in %s", "OK" if self.results["ok"] else "NOT OK", len(self.results["failures"]),
                 self.results.get("elapsed_s", 0), self.out / "gpu.json")


def _events(run_dir: Path) -> list[dict[str, Any]]:
    path, out = run_dir / "events.jsonl", []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):  # a line torn by a crash; the trainer's own readers skip it too
            out.append(json.loads(line))
    return out


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the launch's process group (the trainer saves and exits), SIGKILL if it is still there 15 s later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(15)
            return


def _f(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _gib(value: Any) -> str:
    return "-" if not value else f"{value / 2**30:.1f}"


def child_env() -> dict[str, Any]:
    import importlib
    import platform
    import types

    import torch

    def nvml(query: Callable[[Any], Any]) -> Any:
        import pynvml

        pynvml.nvmlInit()
        try:
            value = query(pynvml)
            return value.decode() if isinstance(value, bytes) else value
        finally:
            pynvml.nvmlShutdown()

    def worker_gpus() -> list[int]:
        # worker.devices imports the worker's settings (pydantic-settings and more): a bare GPU host may not have them.
        return list(importlib.import_module("worker.devices").gpu_indices(types.SimpleNamespace(worker_gpus=None)))

    facts: dict[str, Any] = {"python": platform.python_version(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    for name, read in {
        "torch": lambda: torch.__version__, "torch_cuda": lambda: torch.version.cuda, "cuda_available": torch.cuda.is_available,
        "device_count": torch.cuda.device_count, "device_name": lambda: torch.cuda.get_device_name(0),
        "capability": lambda: list(torch.cuda.get_device_capability(0)),
        "total_memory": lambda: torch.cuda.get_device_properties(0).total_memory, "bf16_supported": torch.cuda.is_bf16_supported,
        "nccl_version": lambda: list(torch.cuda.nccl.version()), "nccl_available": torch.distributed.is_nccl_available,
        "nvml_count": lambda: int(nvml(lambda n: n.nvmlDeviceGetCount())),
        "nvml_driver": lambda: nvml(lambda n: n.nvmlSystemGetDriverVersion()),
        "worker_gpu_indices": worker_gpus,
    }.items():
        try:
            facts[name] = read()
        except Exception as exc:  # noqa: BLE001 - a fact that cannot be read is itself the finding
            facts[name] = f"error: {type(exc).__name__}: {exc}"
    return facts


def child_load(device: str, run_dir: str) -> dict[str, Any]:
    import torch

    from trainer.checkpoint import load_model, read_meta, resolve_checkpoint_dir

    meta = read_meta(run_dir)
    info = meta["data_info"]
    tokens = torch.randint(0, info["num_outputs"], (2, info["input_shape"][0]), generator=torch.Generator().manual_seed(0))
    result: dict[str, Any] = {"checkpoint": resolve_checkpoint_dir(run_dir).name, "step": meta["step"], "forward": {}}
    outputs = {}
    for dev in ("cuda", "cpu") if device == "cuda" else ("cpu",):
        started = time.perf_counter()
        model = load_model(run_dir, map_location=dev)
        with torch.no_grad():
            outputs[dev] = model(tokens.to(dev)).float().cpu()
        p = next(model.parameters())
        result["forward"][dev] = {"s": round(time.perf_counter() - started, 2), "params": f"{p.device} {p.dtype}",
                                  "shape": list(outputs[dev].shape), "finite": bool(torch.isfinite(outputs[dev]).all())}
    if len(outputs) == 2:
        result["max_abs_diff_cuda_cpu"] = float((outputs["cuda"] - outputs["cpu"]).abs().max())
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--out", type=Path, help="where gpu.json, gpu.log, logs.txt and events.txt go")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--size", choices=tuple(SIZES), help="model and run length (default: the device's own)")
    p.add_argument("--suite", choices=("check", "mfu"), default="check",
                   help="check: the parts above; mfu: the trainer before/after against a hand-written loop (bench/gpu_mfu.py)")
    p.add_argument("--before-tree", type=Path, help="mfu: a directory holding the old trainer/ package, run as 'before'")
    p.add_argument("--budget-s", type=float, help="no part starts after this; keep it under any outer timeout (250 cuda, 1200 cpu)")
    p.add_argument("--child", choices=("env", "load"), help=argparse.SUPPRESS)
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        # bench/ is sys.path[0] here; its modules (scheduler, report, ...) must not shadow anything torch imports.
        sys.path[:] = [x for x in sys.path if Path(x or ".").resolve() != Path(__file__).resolve().parent]
        answer = child_env() if args.child == "env" else child_load(args.device, args.run_dir)
        sys.stdout.write(json.dumps(answer, default=str) + "\n")
        return 0
    if args.out is None:
        p.error("--out is required")
    args.out.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S",
                        handlers=[logging.StreamHandler(sys.stdout), logging.FileHandler(args.out / "gpu.log", mode="w")])
    # An outer `timeout` sends SIGTERM: unwind through the finally blocks, so the trainer is stopped and the table written.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    size = args.size or args.device
    check = Check(args.out, args.device, args.budget_s or SIZES[size]["budget_s"], size)
    started = time.monotonic()
    try:
        check.part("env", check.environment)
        if args.suite == "mfu":
            import gpu_mfu

            gpu_mfu.run_suite(check, args.before_tree)
            return 0 if check.results["ok"] else 1
        for title, strategy, precision in VARIANTS:
            check.part(title, check.train, title, strategy, precision)
        check.part("fsdp_bf16_resume", check.resume)
        check.part("load", check.load)
    finally:
        check.results["elapsed_s"] = round(time.monotonic() - started, 1)
        check.save()
        if args.suite == "mfu":
            import gpu_mfu

            gpu_mfu.table(check)
        else:
            check.table()
        shutil.rmtree(check.work, ignore_errors=True)  # the logs and events are in DIR already
    return 0 if check.results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
