"""``python -m trainer --spec SPEC --run-dir DIR``, normally started by torchrun."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from jobspec.pdeathsig import die_with_parent

die_with_parent()  # first: a rank must not outlive torchrun, even one that died while this interpreter started

from trainer.rank_output import interleave  # noqa: E402

interleave()  # before torch is imported: everything the rank prints, in order, in one file

from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

from jobspec.exit_codes import SPEC_ERROR_EXIT_CODE, exit_now  # noqa: E402
from jobspec.spec import JobSpec, SpecLimits, load_spec_file  # noqa: E402

log = logging.getLogger("trainer")


def _setup_logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=os.environ.get("TORCHYARD_LOG_LEVEL", "INFO").upper(),
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


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


if __name__ == "__main__":
    # An exception out of main() exits the usual way, with its traceback.
    exit_now(_run())
