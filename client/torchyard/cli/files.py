"""``torchyard download`` and ``torchyard artifacts``: a job's weights and checkpoints, and the files it wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from torchyard.cli.main import JobIdArg, _dump, _echo_json, _settings, app, console, handles_errors


@app.command()
@handles_errors
def download(
    ctx: typer.Context,
    job_id: JobIdArg,
    step: Annotated[int | None, typer.Option("--step", min=0, help="That checkpoint's weights; default the latest that has them.",
                                             show_default=False)] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="File (or directory) to write; default the server's "
                                                                       "file name in the current directory.", show_default=False)] = None,
    checkpoint_path: Annotated[str | None, typer.Option("--path", help="The checkpoint whose listed path ends with this "
                                                        "('last.ckpt', 'checkpoint-500'); a file checkpoint downloads whole.",
                                                        show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print where it went as JSON.")] = False,
) -> None:
    """Download a job's consolidated weights (a safetensors file), or a checkpoint its script wrote (a directory as a tar)."""
    client = _settings(ctx).client()
    listed = client.checkpoints(job_id) if checkpoint_path is not None or step is not None else []
    if checkpoint_path is not None:
        step = _checkpoint_step(listed, job_id, checkpoint_path)
    chosen = next((c for c in listed if c.step == step), None)
    if chosen is not None and chosen.weights_url is None and chosen.details.get("found") in ("huggingface", "accelerate", "glob"):
        path = client.download_checkpoint_archive(job_id, chosen.step, output)  # a directory: one tar file
    else:
        path = client.download_weights(job_id, output, step=step)
    if as_json:
        _echo_json({"job_id": job_id, "step": step, "path": str(path), "size_bytes": path.stat().st_size})
        return
    console.print(f"wrote {escape(str(path))} ({path.stat().st_size / 1e6:.1f} MB)")


def _checkpoint_step(checkpoints: list[Any], job_id: str, wanted: str) -> int:
    """The step of the one checkpoint whose path ends with ``wanted`` (whole path components)."""
    tail = Path(wanted.strip("/")).parts
    matches = [c.step for c in checkpoints if tail and Path(c.path).parts[-len(tail):] == tail]
    if len(matches) != 1:
        listed = ", ".join(Path(c.path).name for c in checkpoints[-5:]) or "none"
        raise typer.BadParameter(f"{len(matches)} checkpoints of job {job_id} end with {wanted!r} (latest: {listed})",
                                 param_hint="--path")
    return matches[0]


@app.command()
@handles_errors
def artifacts(
    ctx: typer.Context,
    job_id: JobIdArg,
    get: Annotated[str | None, typer.Option("--get", help="Download this file (a path as listed).", show_default=False)] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Where --get writes; default the file's name in the "
                                                                       "current directory.", show_default=False)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the files a job wrote under its artifacts/ directory (TensorBoard events, profiler traces) and, as workdir/PATH,
    in its working directory (framework checkpoints and logs, outputs), or download one."""
    client = _settings(ctx).client()
    if get is not None:
        path = client.download_artifact(job_id, get, output if output is not None else Path(get).name)
        if as_json:
            _echo_json({"job_id": job_id, "artifact": get, "path": str(path), "size_bytes": path.stat().st_size})
        else:
            console.print(f"wrote {escape(str(path))} ({path.stat().st_size} bytes)")
        return
    items = client.artifacts(job_id)
    if as_json:
        _echo_json([_dump(a) for a in items])
        return
    if not items:
        console.print(f"job {escape(job_id)} has no artifacts (yet)")
        return
    for a in items:
        modified = a.modified.strftime("%Y-%m-%d %H:%M:%S") if a.modified else ""
        console.print(f"{a.size_bytes:>12}  {modified}  {escape(a.path)}")


