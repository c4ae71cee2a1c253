"""Turn the suites' results into rows, then into a console table and docs/BENCHMARKS.md."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

Row = tuple[str, str, str, str]  # (benchmark, measurement, figure, ratio / note)


def _n(x: float, digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:,.{digits}f}"


def _r(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"


def _ratio_range(t: dict[str, Any], k: str) -> str:
    """The median paired ratio with the lowest and highest round's, e.g. ``0.98 [0.91-1.04]``."""
    lo_hi = t.get("ratio_ranges", {}).get(k)
    value = t["ratios"][k]
    return f"{_r(value)} [{_r(lo_hi[0])}-{_r(lo_hi[1])}]" if lo_hi else _r(value)


def rows(results: dict[str, Any]) -> list[Row]:
    out: list[Row] = []
    if t := results.get("throughput"):
        s, r = t["summary"], t["ratios"]

        def rr(k: str, t: dict[str, Any] = t) -> str:
            return _ratio_range(t, k)
        names = {"handwritten_tutorial": "(a) hand-written DDP, tutorial (DataLoader)",
                 "handwritten_tuned": "(a') hand-written DDP, tuned (index gather, bucket view)",
                 "handwritten_fused": "(a'') hand-written DDP, tuned, fused AdamW",
                 "trainer": "(b) torchrun -m trainer", "api_job": "(c) job through API + worker"}
        fused = "handwritten_fused" in s  # results files from before (a'') was measured lack it
        for key, label in names.items():
            if key not in s:
                continue
            note = {"trainer": f"b/a {rr('trainer/handwritten_tutorial')}, b/a' {rr('trainer/handwritten_tuned')}"
                               + (f", b/a'' {rr('trainer/handwritten_fused')}" if fused else ""),
                    "api_job": f"c/a {rr('api_job/handwritten_tutorial')}, c/a' {rr('api_job/handwritten_tuned')}, "
                               + (f"c/a'' {rr('api_job/handwritten_fused')}, " if fused else "")
                               + f"c/b {rr('api_job/trainer')}; supervisor "
                               f"{_n(100 * s[key].get('supervisor_cpu_share', float('nan')), 1)}% of a core"}.get(key, "")
            first = s[key]["first_step_s"]
            first_label = "from POST" if key == "api_job" else "from launch"
            out.append(("1 training throughput", label,
                        f"{_n(s[key]['samples_per_s'])} samples/s; first step {_n(first, 2)} s {first_label}", note))
    if f := results.get("fsdp"):
        s, r = f["summary"], f["ratios"]
        for k in ("ddp", "fsdp"):
            out.append(("2 FSDP2 vs DDP", f"{k.upper()} (2 ranks, {f['config']['model']}, {f['config']['params'] / 1e6:.1f}M params)",
                        f"{_n(s[k]['samples_per_s'])} samples/s; params+optim {_n(s[k]['param_optim_mib_per_rank'], 1)} MiB/rank; "
                        f"peak RSS {_n(s[k]['peak_rss_mib_per_rank'])} MiB/rank", ""))
        out.append(("2 FSDP2 vs DDP", "FSDP2 / DDP", f"samples/s {_r(r['fsdp/ddp samples_per_s'])}",
                    f"params+optim/rank {_r(r['fsdp/ddp param+optim bytes per rank'])}; "
                    f"peak RSS/rank {_r(r['fsdp/ddp peak RSS per rank'])}"))
    if d := results.get("dispatch"):
        s = d["summary"]
        for key, label in (("post_response_s", "POST answered"), ("post_to_running_s", "POST -> running"),
                           ("post_to_first_step_s", "POST -> first step written by rank 0"),
                           ("post_to_first_metric_in_sql_s", "POST -> first metric in SQL (GET shows it)"),
                           ("torchrun_alone_to_first_step_s", "torchrun -m trainer alone: launch -> first step")):
            out.append(("3 dispatch latency", label, f"median {_n(s[key]['median'] * 1e3)} ms, p95 {_n(s[key]['p95'] * 1e3)} ms",
                        f"{d['config']['jobs']} jobs, poll {d['config']['poll_interval_s']} s" if key == "post_to_running_s" else ""))
        out.append(("3 dispatch latency", "POST -> first step / torchrun alone", _r(next(iter(d["ratios"].values()))), "medians"))
    if a := results.get("api"):
        for db, res in a["results"].items():
            for m, label in (("get", "GET /v1/jobs/{id}"), ("post", "POST /v1/jobs")):
                x = res[m]
                bad = sum(n for c, n in x["codes"].items() if not c.startswith("2"))
                out.append(("4 API, 50 clients", f"{label} on {db}",
                            f"{_n(x['rps'])} req/s; p50 {_n(x['p50_ms'], 1)} ms, p99 {_n(x['p99_ms'], 1)} ms",
                            f"{bad} non-2xx" if bad else ""))
        for k, v in a.get("ratios", {}).items():
            out.append(("4 API, 50 clients", k, _r(v), ""))
    if i := results.get("ingest"):
        for db, res in i["results"].items():
            out.append(("5 metrics ingestion", f"events.jsonl -> {db}",
                        f"{_n(res['points_per_s'])} points/s catch-up; {_n(res['live_call_ms_median'], 2)} ms per live poll", ""))
    if p := results.get("reporting"):
        ms, r = p["step_ms"], p["ratios"]
        for mode, label in (("trainer_every_10", "every 10 steps (the default)"), ("trainer_every_1", "every step")):
            out.append(("5 rank-0 reporting cost", f"step time, metrics {label} vs none",
                        f"{_n(ms[mode], 2)} ms vs {_n(ms['none'], 2)} ms", f"samples/s ratio {_r(r[mode + '/none samples_per_s'])}"))
        out.append(("5 rank-0 reporting cost", "one report (all-reduce, host sync, JSON line)", f"{_n(p['per_report_ms'], 2)} ms",
                    "from the two cadences"))
    if t := results.get("tracking"):
        ms, r = t["step_ms"], t["ratios"]
        for mode, label in (("tensorboard", "TensorBoard sink"), ("mlflow", "MLflow sink (local server)")):
            if mode in ms:
                out.append(("9 tracking sinks", f"step time, {label} vs events.jsonl only, every {t['config']['log_every_steps']} steps",
                            f"{_n(ms[mode], 3)} ms vs {_n(ms['jsonl'], 3)} ms", f"samples/s ratio {_r(r[mode + '/jsonl samples_per_s'])}"))
    if c := results.get("checkpoint"):
        runs = c["runs"]
        for v in ("sync", "async"):
            out.append(("6 checkpoints", f"{v} save, {c['config']['params'] / 1e6:.0f}M params, 2 ranks",
                        f"blocked {_n(runs[v]['blocked_median_s'], 2)} s per save; "
                        f"wall added {_n(runs[v]['added_wall_per_save_s'], 2)} s per save",
                        f"save call {_n(runs[v].get('save_call_median_s', float('nan')), 2)} s; "
                        f"step {_n(runs[v]['step_time_s'], 2)} s (none: {_n(runs['none']['step_time_s'], 2)} s)"))
        out.append(("6 checkpoints", "async / sync blocked", _r(c["ratios"]["async/sync blocked"]), ""))
    if rp := results.get("read_path"):
        for db, res in rp["results"].items():
            med, ratio, goals = res["median"], res["ratios"], rp["config"]["goals"]
            for m, label, conns, goal in (("get", "GET /v1/jobs/{id}", rp["config"]["get_connections"], goals["get_ratio"]),
                                          ("post", "POST /v1/jobs, one owner", rp["config"]["post_connections"], goals["post_ratio"])):
                x, bare = med[m], med[f"bare_{m}"]
                bad = x["non2xx"] + x["socket_errors"]
                out.append(("10 read path vs bare FastAPI (wrk)", f"{label} on {db}, {conns} connections",
                            f"{_n(x['rps'])} req/s, p99 {_n(x['p99_ms'], 1)} ms; "
                            f"bare {_n(bare['rps'])} req/s, p99 {_n(bare['p99_ms'], 1)} ms",
                            f"ratio {_r(ratio[m])} (goal {goal})" + (f"; {bad} errors" if bad else "")))
    if sc := results.get("scheduler"):
        cfg = sc["config"]
        for name, x in sc["pass"].items():
            out.append(("11 scheduler", f"one pass, {cfg['hosts']:,} hosts x {cfg['gpus_per_host']} GPUs, {cfg['queued']:,} queued, {name}",
                        f"median {_n(x['median_ms'], 1)} ms, max {_n(x['max_ms'], 1)} ms",
                        f"{x['placed']:,} placed (goal < {cfg['goals']['pass_ms']:.0f} ms)"))
        for name, label in (("scheduler", "best-fit scheduler"), ("head_of_line", "the same, strict order (no skipping)"),
                            ("fifo", "one job per worker, FIFO")):
            if (x := sc["replay"].get(name)) is None:
                continue
            by_size = ", ".join(f"{g}: {_n(h, 1)}" for g, h in x["mean_wait_h_by_gpus"].items())
            out.append(("11 scheduler", f"replay {x['jobs']:,} jobs on {cfg['replay_hosts']}: {label}",
                        f"utilisation {_n(100 * x['utilisation'], 1)}%; queueing delay mean {_n(x['mean_wait_h'], 2)} h, "
                        f"p99 {_n(x['p99_wait_h'], 1)} h", f"mean delay by GPUs asked (h) {by_size}"))
        for demand, runs in sc.get("priority", {}).items():
            if demand == "config":
                continue
            for name, x in runs.items():
                out.append(("11 scheduler", f"priority replay, {demand}: {name}",
                            f"high priority wait p50 {_n(x['high_p50_wait_h'], 2)} h, p99 {_n(x['high_p99_wait_h'], 2)} h; "
                            f"utilisation {_n(100 * x['utilisation'], 1)}% ({_n(100 * x['useful_utilisation'], 1)}% without lost work)",
                            f"Jain {_n(x['jain'], 3)}; {x['preemptions']} preemptions"))
    if sw := results.get("sweeps"):
        cfg = sw["config"]
        for task, res in sw["tasks"].items():
            r = res["ratios"]
            for name, label in (("full", "all to the end"), ("asha", f"ASHA, eta {cfg['eta']}, {cfg['rungs']} rungs")):
                x = res[name]
                out.append(("12 sweeps", f"{cfg['trials']} trials, {task}, on {cfg['hosts']}: {label}",
                            f"{_n(x['gpu_hours'], 2)} GPU-h, wall {_n(x['wall_h'], 2)} h; best {cfg['metric']} {_n(x['best'], 4)}",
                            f"{x['launches']} launches, {x['steps']:,} steps"))
            if late := res.get("asha_late_start"):
                out.append(("12 sweeps", f"{task}: ASHA, first rung at {late['min_resource']} steps, {late['rungs']} rungs "
                            "(same curves)",
                            f"GPU-hours {_r(late['gpu_hours full/asha'])} fewer; best {_n(100 * late['best gap'], 2)}% below",
                            f"best {cfg['metric']} {_n(late['best'], 4)}"))
            for b, x in res.get("asha_brackets", {}).items():
                out.append(("12 sweeps", f"{task}: asynchronous Hyperband, {b} brackets (same curves)",
                            f"GPU-hours {_r(x['gpu_hours full/asha'])} fewer; best {_n(100 * x['best gap'], 2)}% below",
                            f"best {cfg['metric']} {_n(x['best'], 4)} (bracket {x['best_bracket']}, ranks {x['pick_rank_in_full']} "
                            f"of {cfg['trials']}); {x['launches']} launches, {x['steps']:,} steps"))
            corr = ", ".join(f"{k}: {_n(v, 2)}" for k, v in res["rung_rank_correlation"].items())
            out.append(("12 sweeps", f"{task}: ASHA against the full search", f"GPU-hours {_r(r['gpu_hours full/asha'])} fewer; "
                        f"best {_n(100 * r['best gap'], 2)}% below",
                        f"goal >= {cfg['goals']['gpu_hours_ratio']}x, within {100 * cfg['goals']['best_within']:.0f}%; "
                        f"pick ranks {res['asha_pick_rank_in_full']} of {cfg['trials']}; rank correlation with the end {corr}"))
    if k := results.get("code"):
        for kind, u in k["upload"].items():
            out.append(("7 your own code", f"50 MiB directory ({kind}), first submit --workdir",
                        f"{_n(u['first_submit_upload_s'], 2)} s; {_n(u['sent_bytes'] / 2**20, 1)} MiB sent "
                        f"of a {_n(u['archive_bytes'] / 2**20, 1)} MiB archive",
                        f"pack {_n(u['pack_s'], 2)} s; unchanged again {_n(u['unchanged_again_s'], 2)} s (nothing sent)"))
        s = k["post_to_first_step_s"]
        for key, label in (("uncached", "requirements, environment built"), ("cached", "requirements, environment cached"),
                           ("none", "no requirements")):
            out.append(("7 your own code", f"script job POST -> first step, {label}", f"median {_n(s[key]['median'], 2)} s",
                        f"{k['config']['rounds']} rounds, {k['config']['requirement']}" if key == "uncached" else ""))
    if m := results.get("parallel"):
        s, r = m["summary"], m["ratios"]
        labels = {"ddp": "DDP", "fsdp": "FSDP2", "pp2": "pipeline, 2 stages (1f1b)", "tp2": "tensor parallel, 2 ranks"}
        for key, label in labels.items():
            out.append(("8 model parallelism", f"gpt {m['config']['params'] / 1e6:.2f}M params, 2 ranks: {label}",
                        f"{_n(s[key]['samples_per_s'], 1)} samples/s; {_n(s[key]['max_params_per_rank'])} params/rank "
                        f"({_r(s[key]['params_fraction'])} of the model)",
                        "" if key == "ddp" else f"samples/s vs DDP {_r(r[f'{key}/ddp samples_per_s'])}"))
    if o := results.get("object_store"):
        s, r, cfg = o["summary"], o["ratios"], o["config"]
        for key, label in (("torchyard_up", "upload, worker (manifest last)"), ("boto3_up", "upload, boto3 upload_file"),
                           ("torchyard_down", "resume download, worker (verified)"), ("boto3_down", "download, boto3 download_file")):
            ratio = {"torchyard_up": f"boto3/worker time {_r(r['upload torchyard/boto3'])}",
                     "torchyard_down": f"boto3/worker time {_r(r['download torchyard/boto3'])}"}.get(key, "")
            out.append(("13 object storage", f"{_n(cfg['checkpoint_mib'])} MiB checkpoint, {label}",
                        f"{_n(s[key]['median_s'], 2)} s; {_n(s[key]['mib_per_s'])} MiB/s", ratio))
    return out


def print_table(table: list[Row]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # plain text when Rich is missing
        for r in table:
            print(" | ".join(r))  # noqa: T201 - the benchmark's output is its UI
        return
    t = Table(title="torchyard benchmarks", show_lines=False)
    for col in ("benchmark", "measurement", "figure", "ratio / note"):
        t.add_column(col)
    for r in table:
        t.add_row(*r)
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # a log file or pipe: do not wrap the table at 80 columns
    console.print(t)


def markdown_table(table: list[Row]) -> str:
    lines = ["| benchmark | measurement | figure | ratio / note |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in table]
    return "\n".join(lines)


BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def update_doc(path: Path, command: str, machine: dict[str, Any], table: list[Row], results_file: str, elapsed_s: float) -> None:
    """Rewrite the generated block of docs/BENCHMARKS.md, keeping the hand-written text around it."""
    m = machine
    block = "\n".join([
        BEGIN,
        f"Generated by `{command}` on {m['date']} in {elapsed_s / 60:.1f} minutes.",
        "",
        f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['mem_gib']} GiB RAM, "
        f"{'GPU ' + m['gpu'] if m['gpu'] else 'no GPU (all figures on the CPU, gloo)'}; torch {m['torch']}, "
        f"Python {m['python']}; load average at start {', '.join(f'{x:.1f}' for x in m['load_avg_start'])} "
        "(the machine is shared: read the ratios, which pair both sides in the same run).",
        "",
        markdown_table(table),
        "",
        f"Raw figures: `{results_file}` (git-ignored; every run writes its own).",
        END,
    ])
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
