"""A rank killed (SIGKILL, as the lease watchdog kills an attempt) the instant a checkpoint becomes the one to resume
from: every step up to that checkpoint is already in events.jsonl. The next attempt resumes after the checkpoint's
step, so a metric written only after the ``latest`` pointer would never be written by anyone: a lost step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import ROOT
from torchyard.events import EVENTS_FILE
from trainer.checkpoint import LATEST, step_dir_name

# One rank of the real trainer pieces (writer, reporter, checkpointer) on a tiny model; the process kills itself with
# SIGKILL right after the checkpoint's ``latest`` pointer is replaced, the worst moment a kill can land on.
RANK = textwrap.dedent('''
    import os, signal, sys
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from trainer import checkpoint
    from trainer.checkpoint import Checkpointer, TrainPosition
    from trainer.data.base import DataInfo
    from trainer.distributed import RankInfo
    from torchyard.events import EventWriter
    from trainer.metrics import MetricsReporter
    from jobspec.spec import spec_from_dict

    run_dir, store = Path(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    spec = spec_from_dict({
        "name": "kill", "model": {"name": "mlp", "args": {"hidden": 4}},
        "data": {"name": "synthetic-classification", "args": {"samples": 64, "features": 4, "classes": 2}},
        "parallel": {"strategy": "ddp", "nproc_per_node": 1},
        "train": {"epochs": 1, "global_batch_size": 8, "log_every_steps": 1},
        "checkpoint": {"every_steps": 4},
    })
    rank = RankInfo(0, 0, 1, 1, torch.device("cpu"), "gloo")
    events = EventWriter(run_dir, enabled=True)
    reporter = MetricsReporter(events, rank, every=1, total_steps=8, global_batch=8)
    net = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    checkpointer = Checkpointer(run_dir, spec, rank, events, {"name": "mlp", "args": {"hidden": 4}},
                                DataInfo("classification", (4,), 2))
    replace = checkpoint.write_atomic

    def pointer_then_kill(path, data, *args, **kwargs):
        replace(path, data, *args, **kwargs)
        if path.name == checkpoint.LATEST:
            os.kill(os.getpid(), signal.SIGKILL)

    checkpoint.write_atomic = pointer_then_kill
    for step in range(1, 5):
        reporter.train_step(step, 0, torch.tensor(1.0 / step), torch.tensor(0.5), 0.1)
    checkpointer.save(TrainPosition(4, 0, 4, 0.0), 0, net, optimizer, scheduler, None)
''')


@pytest.mark.slow  # torch processes that train: not in the quick loop
def test_a_rank_killed_as_its_checkpoint_lands_has_written_every_step_up_to_it(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", RANK, str(tmp_path), str(tmp_path / "store")], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    # What the next attempt resumes from: the checkpoint of step 4, so it trains on from step 5.
    assert (tmp_path / "checkpoints" / LATEST).read_text().strip() == step_dir_name(4)
    lines = (tmp_path / EVENTS_FILE).read_text().splitlines()
    steps = [e["step"] for e in map(json.loads, lines) if e["type"] == "metric"]
    assert steps == [1, 2, 3, 4], "a step the next attempt will not run again was never written"
