"""A rank of a multi-rank job that never joins a process group of the job's world size leaves a note."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jobspec.env_rules import env_name_problem
from jobspec.rank_logs import NOTE_PREFIX, process_group_warning
from jobspec.spec import spec_from_dict
from tests.helpers import ROOT
from worker.devices import cpu_env

RANK = textwrap.dedent('''
    import sys
    from pathlib import Path
    from trainer import pg_watch
    assert pg_watch.install(Path(sys.argv[1]))
    import torch, torch.distributed as dist
    if sys.argv[5] == "trains":
        weight = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([weight], lr=0.1)
        weight.sum().backward()
        opt.step()
    if sys.argv[2] != "none":
        dist.init_process_group("gloo", init_method="file://" + sys.argv[3], rank=int(sys.argv[4]), world_size=int(sys.argv[2]))
        dist.barrier()
        dist.destroy_process_group()
''')


def _ranks(tmp_path: Path, name: str, world: str, count: int, trains: bool = True) -> Path:
    logs = tmp_path / name
    logs.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(logs), world, str(tmp_path / f"{name}.store"), str(r),
                               "trains" if trains else "idle"],
                              env={**os.environ, "PYTHONPATH": str(ROOT), "WORLD_SIZE": "2", "RANK": str(r)})
             for r in range(count)]
    assert [p.wait(timeout=120) for p in procs] == [0] * count
    return logs


@pytest.mark.slow  # torch processes that train: not in the quick loop
def test_ranks_alone_are_noted_and_a_whole_group_is_not(tmp_path: Path) -> None:
    alone = _ranks(tmp_path, "alone", "none", 1)
    assert (alone / f"{NOTE_PREFIX}0").read_text().strip() == \
        "rank 0 of 2 never called init_process_group; optimizer steps in this process: 1"
    warning = process_group_warning(alone)
    assert warning is not None and "init_process_group" in warning and "never formed a process group" in warning
    assert "each probably trained alone on all the data" in warning
    small = _ranks(tmp_path, "small", "1", 1)  # a group of one where torchrun started two
    assert "joined a process group of 1" in (small / f"{NOTE_PREFIX}0").read_text()
    whole = _ranks(tmp_path, "whole", "2", 2)
    assert list(whole.iterdir()) == [] and process_group_warning(whole) is None


@pytest.mark.slow  # torch processes that train: not in the quick loop
def test_ranks_that_never_trained_are_not_said_to_have_trained_alone(tmp_path: Path) -> None:
    """pytorch/examples' DDP scripts start their own processes with mp.spawn(nprocs=torch.cuda.device_count()): none
    on a CPU host, and the ranks torchrun started exit 0 having trained nothing."""
    idle = _ranks(tmp_path, "idle", "none", 2, trains=False)
    warning = process_group_warning(idle) or ""
    assert warning.startswith("warning: 2 rank(s) never formed a process group of the job's world size (rank 0 of 2 never "
                              "called init_process_group) and took no optimizer step in their own process"), warning
    assert "trained alone" not in warning and "mp.spawn" in warning


def test_accelerate_settings_are_allowed_and_cpu_placements_get_use_cpu() -> None:
    assert env_name_problem("ACCELERATE_USE_CPU") is None
    assert env_name_problem("ACCELERATE_MIXED_PRECISION") is None
    assert "names a file" in (env_name_problem("ACCELERATE_CONFIG_FILE") or "")
    script = spec_from_dict({"kind": "script", "name": "a", "entrypoint": "t.py"})
    assert cpu_env(script, gpus=0).env == {"ACCELERATE_USE_CPU": "1"}
    assert cpu_env(script, gpus=2).env == {}
    on_cpu = spec_from_dict({"kind": "script", "name": "a", "entrypoint": "t.py", "parallel": {"device": "cpu"},
                             "env": {"ACCELERATE_USE_CPU": "0"}})
    assert cpu_env(on_cpu, gpus=2).env == {"ACCELERATE_USE_CPU": "0"}  # the job's own value wins
