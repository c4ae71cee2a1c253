"""Trains SPEC.json on one CPU rank in this process and writes, per optimizer step, where the trainer's own code
read a tensor's value on the host (``.item()``, ``.tolist()``, ``float(t)``, ``bool(t)``, ``.cpu()``, ...).

On a GPU each such read waits for every kernel queued before it, so the GPU idles while the host queues the
next ones. Reads inside torch itself are not counted: they differ between the CPU and the CUDA code paths.

Usage: ``python tests/trainer/count_host_reads.py SPEC.json RUN_DIR OUT.json``
"""

from __future__ import annotations

import functools
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

TRAINER = str(Path(__file__).resolve().parents[2] / "trainer")
READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy")


def main(spec_path: str, run_dir: str, out: str) -> None:
    from jobspec.spec import parse_spec
    from trainer import distributed, loop
    from trainer.profiling import StepProfiler

    step = {"now": 0}
    reads: dict[int, list[str]] = defaultdict(list)

    def before(self: StepProfiler, s: int, _orig=StepProfiler.before) -> None:
        step["now"] = s
        _orig(self, s)

    def counted(name: str, orig):
        @functools.wraps(orig)
        def read(self, *args, **kwargs):
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(TRAINER) and step["now"]:
                reads[step["now"]].append(f"{Path(caller.f_code.co_filename).name}:{caller.f_code.co_name}:{name}")
            return orig(self, *args, **kwargs)
        return read

    def close(self: StepProfiler, _orig=StepProfiler.close) -> None:
        step["now"] = 0  # the loop is over: the final checkpoint and the shard footprint read as they may
        _orig(self)

    StepProfiler.before, StepProfiler.close = before, close
    for name in READS:
        setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    rank = distributed.init_distributed("cpu")
    code = loop.run(parse_spec(json.loads(Path(spec_path).read_text())), Path(run_dir), rank, None)
    distributed.shutdown()
    Path(out).write_text(json.dumps({"exit_code": code, "reads": reads}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
