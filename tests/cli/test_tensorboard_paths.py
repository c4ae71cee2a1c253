"""`torchyard tensorboard` takes the SDK's event files and those a framework wrote anywhere in the job's working
directory, and never writes outside its logdir."""

from __future__ import annotations

from pathlib import Path

from torchyard.cli.tensorboard import local_path


def test_tensorboard_takes_event_files_from_the_working_directory_too() -> None:
    assert local_path("tensorboard/events.out.tfevents.1") == Path("events.out.tfevents.1")
    assert local_path("workdir/out/runs/x/events.out.tfevents.2") == Path("workdir/out/runs/x/events.out.tfevents.2")
    assert local_path("workdir/out/checkpoint-5/model.safetensors") is None and local_path("notes.txt") is None
    assert local_path("workdir/../../etc/events.out.tfevents.3") is None and local_path("tensorboard/../x") is None
