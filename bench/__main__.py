"""``python -m bench``: run every benchmark, print a table, write bench/results/<timestamp>.json and
rewrite the generated part of docs/BENCHMARKS.md.

    python -m bench                        # everything (about 26 minutes on a 2-core VM)
    python -m bench --only api,dispatch    # some suites, see SUITES below
    python -m bench --quick                # shorter runs, fewer rounds and jobs, for iterating
    python -m bench --no-doc               # leave docs/BENCHMARKS.md alone

A partial or quick run never rewrites the doc unless ``--doc`` forces it: the doc holds full runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench import (
    api_bench,
    code_bundles,
    dispatch,
    ingest_bench,
    model_parallel,
    object_store,
    queued_dispatch,
    read_path,
    report,
    scheduler,
    sweeps,
    tracking,
    training,
)
from bench.common import REPO, Ctx, machine

log = logging.getLogger("bench")

SUITES: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    "throughput": training.throughput,  # 1, and 5b (reporting cost)
    "fsdp": training.fsdp_vs_ddp,  # 2
    "dispatch": dispatch.dispatch,  # 3
    "api": api_bench.api,  # 4
    "ingest": ingest_bench.ingest,  # 5a
    "reporting": training.reporting,  # 5b
    "checkpoint": training.checkpoints,  # 6
    "code": code_bundles.code,  # 7
    "parallel": model_parallel.model_parallel,  # 8
    "tracking": tracking.tracking,  # 9
    "read_path": read_path.read_path,  # 10: wrk, torchyard vs a bare FastAPI app
    "scheduler": scheduler.scheduler,  # 11: the placement policy alone: one pass, and a trace replay against FIFO
    "queued_dispatch": queued_dispatch.queued_dispatch,  # 11c: POST -> running with 1,000 jobs queued, real service
    "sweeps": sweeps.sweeps,  # 12: ASHA of 27 trials against all 27 to the end (measured curves, simulated hosts)
    "object_store": object_store.object_store,  # 13: a 1 GiB checkpoint up to an S3 server and down, against boto3's own
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help=f"comma-separated suites: {','.join(SUITES)}")
    ap.add_argument("--quick", action="store_true", help="shorter runs for iteration (figures are noisier)")
    ap.add_argument("--doc", dest="doc", action="store_true", default=None, help="rewrite docs/BENCHMARKS.md even for a partial run")
    ap.add_argument("--no-doc", dest="doc", action="store_false")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory (run dirs, logs, databases)")
    ap.add_argument("--merge", type=Path, help="a results JSON whose suites are kept unless run again (to redo one suite)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("alembic", "httpx", "jobs.store.db"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    chosen = [s.strip() for s in args.only.split(",") if s.strip()] or list(SUITES)
    unknown = [s for s in chosen if s not in SUITES]
    if unknown:
        ap.error(f"unknown suites {unknown}; choose from {list(SUITES)}")
    work = Path(tempfile.mkdtemp(prefix="torchyard-bench-"))
    ctx = Ctx(work=work, quick=args.quick)
    merged_s = 0.0
    if args.merge:
        previous = json.loads(args.merge.read_text())
        ctx.results.update({k: v for k, v in previous.items() if k in SUITES})
        merged_s = float(previous.get("elapsed_s", 0.0))
    info = machine()
    started = time.perf_counter()
    failed: dict[str, str] = {}
    try:
        for name in chosen:
            t0 = time.perf_counter()
            log.info("== %s", name)
            try:
                ctx.results[name] = SUITES[name](ctx)
            except Exception as exc:  # noqa: BLE001 - one broken suite must not lose the others' figures
                log.exception("suite %s failed", name)
                failed[name] = f"{type(exc).__name__}: {exc}"
            log.info("== %s took %.0fs", name, time.perf_counter() - t0)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    elapsed = time.perf_counter() - started

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = REPO / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    out_file = out_dir / f"{stamp}.json"
    command = "python -m bench" + (" --quick" if args.quick else "") + (f" --only {args.only}" if args.only else "")
    if args.merge:
        command += f" --merge {args.merge.name}"
    record = {"command": command, "machine": info, "elapsed_s": elapsed, "failed": failed, "incidents": training.INCIDENTS}
    out_file.write_text(json.dumps({**record, **ctx.results},
                                   indent=1, default=str))
    table = report.rows(ctx.results)
    if training.INCIDENTS:
        table.append(("incidents", "trainer runs that exited non-zero after their 'done' event", str(len(training.INCIDENTS)),
                      "; ".join(training.INCIDENTS)))
    report.print_table(table)
    full = set(ctx.results) == set(SUITES) and not args.quick and not failed
    if args.doc or (args.doc is None and full):
        # A merged run took the two invocations' time together.
        report.update_doc(REPO / "docs" / "BENCHMARKS.md", command, info, table, str(out_file.relative_to(REPO)), elapsed + merged_s)
        log.info("docs/BENCHMARKS.md updated")
    log.info("results in %s; %.1f minutes", out_file.relative_to(REPO), elapsed / 60)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
