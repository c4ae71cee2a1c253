"""``profile: {start_step, steps, memory}``: a torch.profiler trace of those optimizer steps on every rank,
written to ``artifacts/profiler/rank{N}.json.gz`` (Chrome trace format: Perfetto, chrome://tracing and
TensorBoard's profiler plugin read it).

The profiler is started right before ``start_step`` and stopped right after its last step, so every other
step pays one integer comparison and nothing is recorded outside the window.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from jobspec.spec import ProfileSpec
from torchyard.atomic import replacing
from trainer.distributed import RankInfo

log = logging.getLogger(__name__)

PROFILER_DIR = "artifacts/profiler"


class StepProfiler:
    """Call ``before(step)`` before optimizer step ``step`` (1-based) runs and ``after(step)`` once it is done."""

    def __init__(self, spec: ProfileSpec | None, run_dir: Path, rank: RankInfo):
        self.spec = spec
        self.path = run_dir / PROFILER_DIR / f"rank{rank.rank}.json.gz"
        self._device = rank.device
        self._prof: torch.profiler.profile | None = None
        self._first = spec.start_step if spec else -1
        self._last = spec.start_step + spec.steps - 1 if spec else -1

    def before(self, step: int) -> None:
        if step != self._first or self._prof is not None:
            return
        assert self.spec is not None
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self._device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        memory = self.spec.memory
        self._prof = torch.profiler.profile(activities=activities, record_shapes=memory, profile_memory=memory, with_stack=False)
        self._prof.__enter__()
        log.info("profiling steps %d..%d", self._first, self._last)

    def after(self, step: int) -> None:
        if self._prof is not None:
            self._prof.step()
            if step >= self._last:
                self.close()

    def close(self) -> None:
        """Stop (a window cut short by the end of training or a stop signal still writes what it has) and export."""
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        prof.__exit__(None, None, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A reader never sees a half-written trace. gzip-compressed: the temporary's name ends in .gz too.
        with replacing(self.path) as tmp:
            gz = tmp.with_name(tmp.name + ".json.gz")
            prof.export_chrome_trace(str(gz))
            os.replace(gz, tmp)
        log.info("profiler trace written to %s", self.path)
