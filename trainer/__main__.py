"""``python -m trainer --spec SPEC --run-dir DIR``, normally started by torchrun.

Or forked from torchrun (``torchrun --run-path --start-method=fork .../trainer/__main__.py``, how the worker starts
catalog jobs: worker/launch.py), which has imported torch already, so the rank does not import it again. A forked
rank is not a fresh interpreter, and this module makes up for it: torchrun's signal handlers and its OpenMP thread
count are put back to what a fresh rank has, and the rank ends by returning (torchrun waits for the return value)
or, with a non-zero code, by SystemExit, never through ``os._exit``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

# Before anything of ours imports torch: only a rank forked from torchrun has it already.
FORKED = "torch" in sys.modules and __name__ == "__main__"

from jobspec.pdeathsig import die_with_parent  # noqa: E402

die_with_parent()  # first: a rank must not outlive torchrun, even one that died while this interpreter started

from trainer.rank_output import interleave  # noqa: E402

interleave()  # before torch is imported: everything the rank prints, in order, in one file

from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

from jobspec.exit_codes import SPEC_ERROR_EXIT_CODE, exit_now, exit_status, flush_output  # noqa: E402
from jobspec.spec import JobSpec, SpecLimits, load_spec_file  # noqa: E402

log = logging.getLogger("trainer")


def _setup_logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=os.environ.get("TORCHYARD_LOG_LEVEL", "INFO").upper(),
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=FORKED,  # whatever torchrun's process configured is not the rank's
    )


def _as_a_fresh_rank() -> None:
    """What a forked rank inherits from torchrun's process and a fresh one would not have: the handlers torchrun
    set for its own SIGTERM, SIGINT, SIGHUP and SIGQUIT (they raise its SignalException), and an OpenMP pool sized
    before torchrun set OMP_NUM_THREADS for its ranks (one thread each when several share a host)."""
    import torch

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m trainer", description="Run one torchyard training job (under torchrun).")
    p.add_argument("--spec", required=True, type=Path, help="job spec, .json or .yaml")
    p.add_argument("--run-dir", required=True, type=Path, help="run directory: events.jsonl, checkpoints/")
    return p.parse_args(argv)


@record
def main(argv: list[str] | None = None) -> int:
    from trainer.startup import PHASES

    PHASES.mark("imports")  # the interpreter's start and torch's import
    _setup_logging()
    if FORKED:
        import torch

        log.info("rank forked from torchrun, which had imported torch; %d intra-op threads", torch.get_num_threads())
    args = _parse_args(argv)
    data_dir = os.environ.get("TORCHYARD_DATA_DIR")
    limits = SpecLimits(data_dir=Path(data_dir) if data_dir else None)
    try:
        spec = load_spec_file(args.spec, limits)
    except (ValueError, OSError) as exc:  # pydantic.ValidationError and SpecError are ValueErrors
        log.error("cannot run spec %s: %s", args.spec, exc)
        return SPEC_ERROR_EXIT_CODE
    if not isinstance(spec, JobSpec):
        # kind: script jobs run the user's entrypoint under torchrun directly, never this training loop.
        log.error("spec %s is a %r job; python -m trainer runs catalog jobs only", args.spec, spec.kind)
        return SPEC_ERROR_EXIT_CODE
    args.run_dir.mkdir(parents=True, exist_ok=True)

    from trainer import distributed, loop

    PHASES.mark("imports")  # and the spec's check and the trainer's own modules
    rank = distributed.init_distributed(spec.parallel.device)
    PHASES.mark("process_group")
    code = loop.run(spec, args.run_dir, rank, limits.data_dir)  # an exception: see _run below
    # Every rank reaches here before any tears its groups down: a rank that destroyed its gloo
    # pairs while a peer still used them made that peer abort ("terminate called ...") after 'done'.
    distributed.shutdown(barrier=True)
    return code


def _run() -> int:
    try:
        return main()
    except BaseException:
        # Torn down only once @record has written this rank's error file: torchrun names as the root cause the rank
        # whose file has the earliest timestamp (whole seconds), and a peer blocked in a collective fails the moment
        # this rank destroys its groups. Torn down first, an OOM here could lose to the peer's "connection closed".
        from trainer import distributed

        distributed.shutdown()  # peers may be gone: no barrier
        raise


def _run_forked() -> int:
    """``_run`` for a forked rank, an exception ending it as it ends a fresh interpreter (its traceback printed,
    exit code 1), but not through torchrun's own @record around the fork: that would write this rank's error file
    again after the teardown that makes its peers fail, and the worker names the rank whose file was written first
    (worker/outcome.py). main()'s @record has written it as the exception was raised."""
    try:
        return _run()
    except SystemExit as exc:
        return exit_status(exc.code)
    except BaseException:  # noqa: BLE001 - every exception ends the rank, as in an interpreter of its own
        sys.excepthook(*sys.exc_info())  # as python reports an uncaught one (torch.distributed prefixes "[rankN]:")
        return 1


def _end_forked(code: int) -> None:
    """The end of a forked rank: torchrun's fork path collects a return value, so a rank that exits through
    ``os._exit`` with 0 leaves it waiting for good; the process itself ends through ``os._exit`` after that
    (multiprocessing's), so the interpreter's teardown is skipped as ``exit_now`` skips it."""
    from trainer import rank_output

    flush_output()
    rank_output.close()  # after the last record and line: a line without its newline reaches the merged log
    if code != 0:
        raise SystemExit(code)


if __name__ == "__main__":
    if FORKED:
        _as_a_fresh_rank()
        _end_forked(_run_forked())
    else:
        # An exception out of main() exits the usual way, with its traceback.
        exit_now(_run())
