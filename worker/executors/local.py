"""The local executor: torchrun on this worker's host, in its own session, killed with the worker.

Exactly what the supervisor has always done (worker/launch.py builds the command and environment,
worker/sandbox/processes.py owns the process tree); each node of a multi-node job is started on the host
the scheduler placed it on (worker/node.py).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from jobs.settings import Settings
from worker.compile_cache import compile_cache_env
from worker.executors.base import LAUNCHER_LOG, Launch, LaunchError, LaunchRequest, Phase, RankState
from worker.launch import start_dir, torchrun_command, torchrun_env
from worker.sandbox import processes


@dataclass
class LocalLaunch(Launch):
    proc: subprocess.Popen[bytes] | None = None

    @property
    def node(self) -> int | None:
        return self.request.node.node_rank if self.request.node else None


class LocalExecutor:
    name = "local"
    allocates_nodes = False

    def __init__(self, settings: Settings):
        self.settings = settings

    def start(self, request: LaunchRequest) -> LocalLaunch:
        command = torchrun_command(request.spec, request.run_dir, request.attempt, self.settings, node=request.node)
        env = torchrun_env(request.job_id, request.attempt, request.run_dir, self.settings, request.spec,
                           resume_from=request.resume_from, node=request.node, secrets=request.secrets, gpus=request.gpus,
                           pause_at=request.pause_at)
        node = request.node.node_rank if request.node else 0
        launcher_log = request.log_dir / (LAUNCHER_LOG if node == 0 else f"launcher-node-{node}.log")
        if request.identity is not None:
            env["HOME"] = str(request.run_dir.resolve())  # the worker's home is not the job's
        # After the job's env (which may not name these): the owner's own compile caches on this host.
        env.update(compile_cache_env(self.settings, request.owner, request.identity, request.run_dir))
        try:
            proc = processes.spawn(command, env, cwd=start_dir(request.spec, request.run_dir, self.settings), log_path=launcher_log,
                                   identity=request.identity)
        except (OSError, subprocess.SubprocessError) as exc:
            # Becoming the job's uid failed (a worker without the capabilities it had at start?): no retry helps here.
            raise LaunchError(f"could not start the ranks: {exc}", transient=False) from exc
        return LocalLaunch(request=request, executor_id=None, launcher_log=launcher_log, proc=proc)

    def poll(self, launch: Launch) -> RankState:
        code = _proc(launch).poll()
        return RankState(Phase.RUNNING) if code is None else RankState(Phase.EXITED, exit_code=code)

    def stop(self, launch: Launch, grace_s: float, on_wait: Callable[[], None] | None = None) -> RankState:
        assert isinstance(launch, LocalLaunch)
        code = processes.stop(_proc(launch), launch.request.job_id, grace_s, on_wait=on_wait, node=launch.node,
                              attempt=launch.request.attempt, identity=launch.request.identity)
        return RankState(Phase.EXITED, exit_code=code)

    def release(self, launch: Launch) -> None:
        assert isinstance(launch, LocalLaunch)
        # Strays such as data-loader workers orphaned by a dead rank.
        self.kill(launch)

    def kill(self, launch: Launch) -> None:
        assert isinstance(launch, LocalLaunch)
        # By the attempt's uid and cgroup, or by its mark: a newer attempt of the same job on this host lives on.
        processes.kill_attempt(launch.request.job_id, launch.request.identity, node=launch.node,
                               attempt=launch.request.attempt)

    def attach(self, request: LaunchRequest, executor_id: str) -> Launch:
        raise LaunchError("a local attempt cannot be attached: its processes die with the worker that started them",
                          transient=False)


def _proc(launch: Launch) -> subprocess.Popen[bytes]:
    if not isinstance(launch, LocalLaunch) or launch.proc is None:
        raise TypeError(f"not a local launch: {launch!r}")
    return launch.proc
