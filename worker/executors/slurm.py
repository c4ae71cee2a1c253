"""The Slurm executor: each attempt is one Slurm batch job (docs/executors.md).

``sbatch`` runs a script generated from the spec: one task per node (``srun``), each a torchrun that
starts its node's ranks, meeting at a c10d rendezvous on the allocation's first node. The command
line and environment are the local executor's (worker/launch.py), so a job behaves the same on both;
the run directory is on storage the worker and every node share, so the supervisor tails
events.jsonl and the logs there exactly as it does for a local attempt.

- Tracking: ``scontrol show job`` (squeue's view plus the exit code, the reason and preemption
  time); once slurmctld forgot the job (MinJobAge), ``sacct`` where accounting exists.
- Stopping: ``scancel --signal=TERM`` reaches every node's torchrun, which forwards it to its ranks;
  they checkpoint and exit. After the grace period, ``scancel --signal=KILL --full`` and ``scancel``.
- ``--no-requeue``: Slurm never reruns an attempt behind the supervisor's back. A preemption ends
  the Slurm job (its ranks get SIGTERM and the partition's GraceTime first); the supervisor then
  requeues the torchyard job, and the next attempt is a new Slurm job that resumes from the checkpoint.
  Should Slurm requeue it all the same (an administrator's ``scontrol update Requeue=1`` and
  ``scontrol requeue``), the attempt is reported preempted at its first restart and the requeued
  Slurm job is cancelled: one Slurm run is one attempt, and the next one resumes from the checkpoint.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from jobs.settings import Settings
from jobspec.exit_codes import PAUSE_AT_ENV
from manifests.launch import DEFAULT_RDZV_PORT, default_gpus
from manifests.slurm import Allocation, directives, rendezvous
from worker.executors.base import LAUNCHER_LOG, EngineReason, Launch, LaunchError, LaunchRequest, Phase, RankState
from worker.launch import start_dir, torchrun_command, torchrun_env
from worker.sandbox.processes import JOB_MARK, NODE_MARK

log = logging.getLogger(__name__)

BATCH_SCRIPT = "sbatch.sh"
SLURM_OUTPUT = "slurm.out"  # the batch script's own output: srun's and slurmstepd's messages
COMMAND_TIMEOUT_S = 60.0
# Slurm sends --signal up to this much earlier than asked (its event resolution).
SIGNAL_RESOLUTION_S = 60

# The worker's own TORCHYARD_* settings carry credentials (database URL, admin token): only the
# variables the ranks read travel to the cluster (slurmctld stores a batch job's environment).
RANK_SETTINGS = frozenset({"TORCHYARD_JOB_ID", "TORCHYARD_ATTEMPT", "TORCHYARD_RUN_DIR", "TORCHYARD_DATA_DIR",
                           "TORCHYARD_CODE_DIR", "TORCHYARD_RESUME_FROM", "TORCHYARD_LOG_LEVEL", "TORCHYARD_FAULTS",
                           PAUSE_AT_ENV})

_PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}
_RUNNING = {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING", "SUSPENDED", "STOPPED"}
_REASONS = {
    "TIMEOUT": EngineReason.TIME_LIMIT, "DEADLINE": EngineReason.TIME_LIMIT,
    "NODE_FAIL": EngineReason.NODE_FAILURE, "BOOT_FAIL": EngineReason.NODE_FAILURE,
    "PREEMPTED": EngineReason.PREEMPTED, "OUT_OF_MEMORY": EngineReason.OUT_OF_MEMORY,
    "CANCELLED": EngineReason.CANCELLED, "REVOKED": EngineReason.CANCELLED,
}
# Pending reasons that no amount of waiting resolves: the request exceeds what the partition or account allows.
_NEVER = {"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints", "InvalidAccount", "InvalidQOS",
          "AccountNotAllowed", "QOSNotAllowed", "DependencyNeverSatisfied"}
_TRANSIENT = ("Unable to contact slurm controller", "Socket timed out", "Connection refused", "Zero Bytes were transmitted",
              "Slurm backup controller in standby mode", "Communication connection failure", "Resource temporarily unavailable")
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][\w/:]*)=(\S*)")


@dataclass
class SlurmLaunch(Launch):
    stopping: bool = False  # this executor is cancelling it: a CANCELLED end is ours, not an administrator's
    checked_at: float = -math.inf
    last: RankState | None = None


@dataclass(frozen=True)
class JobRecord:
    """What Slurm says about one job (scontrol show job, or sacct)."""

    state: str
    exit_code: int | None
    reason: str
    run_s: float | None
    limit_s: float | None
    preempted: bool
    restarts: int = 0  # times Slurm requeued the job (scontrol's Restarts)

    @property
    def live(self) -> bool:
        """Still in squeue: pending, running or being torn down."""
        return self.state in _PENDING or self.state in _RUNNING

    def rank_state(self, warning_s: float, stopping: bool) -> RankState:
        detail = f"Slurm job state {self.state}" + (f", reason {self.reason}" if self.reason not in ("", "None") else "")
        if self.restarts and not stopping:
            # Requeued by Slurm: the run this attempt was ended (its ranks had SIGTERM and KillWait to checkpoint).
            return RankState(Phase.EXITED, exit_code=self.exit_code, reason=EngineReason.PREEMPTED,
                             detail=f"{detail}; requeued by Slurm ({self.restarts} restart(s))")
        if self.state in _PENDING:
            return RankState(Phase.PENDING, reason=EngineReason.UNSCHEDULABLE if self.reason in _NEVER else None, detail=detail)
        if self.state in _RUNNING:
            return RankState(Phase.RUNNING, detail=detail)
        reason = _REASONS.get(self.state)
        if self.preempted and not stopping:
            reason = EngineReason.PREEMPTED
        elif reason is EngineReason.CANCELLED and stopping:
            reason = None
        elif reason is None and self.exit_code not in (0, None) and not stopping and self._near_limit(warning_s):
            # The ranks stopped on --signal's SIGTERM ahead of the time limit and exited themselves.
            reason, detail = EngineReason.TIME_LIMIT, f"{detail}; signalled ahead of its time limit"
        return RankState(Phase.EXITED, exit_code=self.exit_code, reason=reason, detail=detail)

    def _near_limit(self, warning_s: float) -> bool:
        if self.run_s is None or self.limit_s is None:
            return False
        return self.run_s >= self.limit_s - warning_s - SIGNAL_RESOLUTION_S


class SlurmExecutor:
    name = "slurm"
    allocates_nodes = True

    def __init__(self, settings: Settings):
        self.settings = settings
        self.warning_s = max(1, math.ceil(settings.stop_grace_s))

    # ------------------------------------------------------------ the contract

    def start(self, request: LaunchRequest) -> SlurmLaunch:
        request.log_dir.mkdir(parents=True, exist_ok=True)
        script = request.log_dir / BATCH_SCRIPT
        script.write_text(self.batch_script(request), encoding="utf-8")
        command = [self._bin("sbatch"), "--parsable", "--export=ALL", f"--chdir={start_dir(request.spec, request.run_dir, self.settings)}",
                   f"--output={request.log_dir / SLURM_OUTPUT}"]
        if self.settings.slurm_partition:
            command.append(f"--partition={self.settings.slurm_partition}")
        if self.settings.slurm_account:
            command.append(f"--account={self.settings.slurm_account}")
        command += [*self.settings.slurm_sbatch_args, str(script)]
        result = self._run(command, env=self.job_env(request))
        if result.returncode != 0:
            message = (result.stderr or result.stdout).strip() or f"sbatch exited {result.returncode}"
            raise LaunchError(message, transient=_transient(message))
        job_id = result.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise LaunchError(f"sbatch printed no job id: {result.stdout!r}", transient=False)
        log.info("job %s attempt %d: Slurm job %s submitted", request.job_id, request.attempt, job_id,
                 extra={"job_id": request.job_id})
        return self.attach(request, job_id)

    def attach(self, request: LaunchRequest, executor_id: str) -> SlurmLaunch:
        """The launch of an attempt submitted earlier (by this worker or another), to poll or stop it."""
        return SlurmLaunch(request=request, executor_id=executor_id, launcher_log=request.log_dir / LAUNCHER_LOG)

    def poll(self, launch: Launch) -> RankState:
        launch = _slurm(launch)
        now = time.monotonic()
        if launch.last is not None and (launch.last.ended or now - launch.checked_at < self.settings.slurm_poll_interval_s):
            return launch.last
        return self._refresh(launch)

    def stop(self, launch: Launch, grace_s: float, on_wait: Callable[[], None] | None = None) -> RankState:
        launch = _slurm(launch)
        state = self._refresh(launch)
        if state.ended:
            self.release(launch)  # a requeued job is ended for us, not for Slurm
            return state
        launch.stopping = True
        job = str(launch.executor_id)
        if state.phase is Phase.RUNNING:
            # Every step's tasks (each node's torchrun) get SIGTERM; the batch shell keeps waiting for srun.
            self._scancel("--signal=TERM", job)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                if self._refresh(launch).ended:
                    return self._settled(launch)
                if on_wait:
                    on_wait()
                time.sleep(0.5)
            log.warning("Slurm job %s still runs %.0fs after SIGTERM; killing it", job, grace_s)
            self._scancel("--signal=KILL", "--full", job)
        self._scancel(job)
        return self._settled(launch)

    def kill(self, launch: Launch) -> None:
        launch = _slurm(launch)
        launch.stopping = True
        self._scancel("--signal=KILL", "--full", str(launch.executor_id))
        self._scancel(str(launch.executor_id))

    def release(self, launch: Launch) -> None:
        """The batch script ended by itself (or Slurm requeued it); make sure Slurm holds nothing of it."""
        launch = _slurm(launch)
        if self._live(launch):
            launch.stopping = True
            self._scancel(str(launch.executor_id))
            self._settled(launch)

    # ------------------------------------------------------------ the batch job

    def allocation(self, request: LaunchRequest) -> Allocation:
        spec = request.spec
        gpus = default_gpus(spec) if spec.parallel.device == "cuda" or self.settings.slurm_gpus else 0  # type: ignore[arg-type]
        # The supervisor stops an attempt at timeout_s; Slurm's limit is the backstop when no supervisor is left,
        # late enough that its early SIGTERM (up to a minute ahead) never precedes the supervisor's own.
        time_s = spec.timeout_s + self.warning_s + SIGNAL_RESOLUTION_S
        return Allocation(
            name=f"torchyard-{request.job_id}-a{request.attempt}", nnodes=spec.parallel.nnodes, time_s=time_s,
            gpus_per_node=gpus, cpus_per_task=spec.parallel.nproc_per_node * self.settings.slurm_cpus_per_rank,
            stop_warning_s=self.warning_s, output=None, extra=("--no-requeue",),
        )

    def batch_script(self, request: LaunchRequest) -> str:
        """The sbatch script of one attempt. Raises SpecError when a script job no longer resolves."""
        spec, nnodes = request.spec, request.spec.parallel.nnodes
        setup, topology = rendezvous(nnodes, DEFAULT_RDZV_PORT)
        topology = [f"--nnodes={nnodes}", *topology]
        if nnodes > 1:
            # A node that never comes fails the launch in seconds, not torchrun's default 15 minutes.
            topology.append(f"--rdzv-conf=join_timeout={int(self.settings.gang_join_timeout_s)}")
        marker = "\0topology"
        argv = torchrun_command(spec, request.run_dir, request.attempt, self.settings, topology=[marker])
        # Generated flags are shell words already ("$head_node:$rdzv_port"); everything else is quoted.
        words = " ".join(" ".join(topology) if arg == marker else shlex.quote(arg) for arg in argv)
        allocation = self.allocation(request)
        return "\n".join([
            "#!/bin/bash",
            f"# torchyard job {request.job_id} attempt {request.attempt}, generated by the worker's Slurm executor.",
            *directives(allocation),
            "set -uo pipefail",
            *setup,
            _node_launch(nnodes),
            f"srun --kill-on-bad-exit=1 --cpus-per-task={allocation.cpus_per_task} /bin/bash -c \"$node_launch\" torchyard-node "
            f"{shlex.quote(str(request.log_dir))} {words}",
            "",
        ])

    def job_env(self, request: LaunchRequest) -> dict[str, str]:
        """The ranks' environment (the local executor's), less the worker's own settings and any
        allocation the worker itself runs in; sbatch --export=ALL hands it to every node."""
        env = torchrun_env(request.job_id, request.attempt, request.run_dir, self.settings, request.spec,
                           resume_from=request.resume_from, secrets=request.secrets, pause_at=request.pause_at)
        keep = RANK_SETTINGS | {JOB_MARK}
        env = {k: v for k, v in env.items()
               if not (k.startswith("TORCHYARD_") and k not in keep) and not (k.startswith(("SLURM_", "SBATCH_", "SRUN_")))}
        if self.settings.slurm_conf:
            env["SLURM_CONF"] = str(self.settings.slurm_conf)
        return env

    # ------------------------------------------------------------ Slurm's commands

    def _refresh(self, launch: SlurmLaunch) -> RankState:
        record = self.record(str(launch.executor_id))
        launch.checked_at = time.monotonic()
        if record is None:
            state = RankState(Phase.GONE, detail=f"Slurm no longer knows job {launch.executor_id}")
        elif isinstance(record, str):
            # The controller did not answer: keep what we knew; the next poll asks again.
            log.warning("Slurm job %s: %s", launch.executor_id, record)
            return launch.last or RankState(Phase.PENDING, detail=record)
        else:
            state = record.rank_state(self.warning_s, launch.stopping)
        launch.last = state
        return state

    def record(self, job: str) -> JobRecord | str | None:
        """Slurm's record of ``job``; a message when the controller did not answer; None when it has none."""
        result = self._run([self._bin("scontrol"), "show", "job", "-o", job])
        if result.returncode == 0 and "JobState=" in result.stdout:
            fields = dict(_FIELD.findall(result.stdout))
            return JobRecord(
                state=fields.get("JobState", "UNKNOWN"), exit_code=_exit_code(fields.get("ExitCode")),
                reason=fields.get("Reason", ""), run_s=_seconds(fields.get("RunTime")), limit_s=_seconds(fields.get("TimeLimit")),
                preempted=fields.get("PreemptTime", "None") not in ("None", "Unknown", ""),
                restarts=int(fields["Restarts"]) if fields.get("Restarts", "").isdigit() else 0,
            )
        message = (result.stderr or result.stdout).strip()
        if _transient(message):
            return message
        return self._accounting(job)

    def _accounting(self, job: str) -> JobRecord | None:
        """sacct's record, where the cluster keeps accounting (slurmdbd); None where it does not."""
        result = self._run([self._bin("sacct"), "-X", "-n", "-P", "-j", job, "--format=State,ExitCode,Elapsed,Timelimit"])
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        if result.returncode != 0 or not lines:
            return None
        state, code, elapsed, limit = (lines[-1].split("|") + ["", "", "", ""])[:4]
        # "CANCELLED by 1000": who cancelled is in the state itself.
        return JobRecord(state=state.split()[0] if state else "UNKNOWN", exit_code=_exit_code(code), reason=state,
                         run_s=_seconds(elapsed), limit_s=_seconds(limit), preempted=False)

    def _live(self, launch: SlurmLaunch) -> bool:
        record = self.record(str(launch.executor_id))
        # A silent controller (a message): assume it still holds the job. None: Slurm no longer knows it.
        return isinstance(record, str) or (record is not None and record.live)

    def _settled(self, launch: SlurmLaunch, timeout_s: float = 60.0) -> RankState:
        """Wait until Slurm finished tearing the job down (COMPLETING: processes are still being killed)."""
        deadline = time.monotonic() + timeout_s
        while self._live(launch) and time.monotonic() < deadline:
            time.sleep(0.5)
        return self._refresh(launch)

    def _scancel(self, *args: str) -> None:
        result = self._run([self._bin("scancel"), *args])
        if result.returncode != 0:
            log.warning("scancel %s: %s", " ".join(args), (result.stderr or result.stdout).strip())

    def _bin(self, name: str) -> str:
        return str(self.settings.slurm_bin_dir / name) if self.settings.slurm_bin_dir else name

    def _run(self, command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        if env is None:
            env = dict(os.environ)
            if self.settings.slurm_conf:
                env["SLURM_CONF"] = str(self.settings.slurm_conf)
        try:
            return subprocess.run(command, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(command, 1, "", f"Socket timed out: {command[0]} took over {COMMAND_TIMEOUT_S:.0f}s")
        except OSError as exc:
            raise LaunchError(f"{command[0]}: {exc}", transient=False) from exc


def _node_launch(nnodes: int) -> str:
    """What srun runs on each node: torchrun ("$@") with that node's log and error file, named as
    the local executor's gang names them (node 0: launcher.log and error.json)."""
    mark = f' {NODE_MARK}="$n"' if nnodes > 1 else ""
    body = (
        'n=${SLURM_NODEID:-0}; log_dir=$1; shift\n'
        f'if [ "$n" = 0 ]; then out={LAUNCHER_LOG} err=error.json; else out=launcher-node-$n.log err=error-node-$n.json; fi\n'
        f'export TORCHELASTIC_ERROR_FILE="$TORCHYARD_RUN_DIR/$err"{mark}\n'
        'exec "$@" >>"$log_dir/$out" 2>&1'
    )
    return f"node_launch={shlex.quote(body)}"


def _slurm(launch: Launch) -> SlurmLaunch:
    if not isinstance(launch, SlurmLaunch) or not launch.executor_id:
        raise TypeError(f"not a Slurm launch: {launch!r}")
    return launch


def _transient(message: str) -> bool:
    return any(text in message for text in _TRANSIENT)


def _exit_code(value: str | None) -> int | None:
    """Slurm's "code:signal" as a Popen return code: the code, or -signal when a signal ended it."""
    if not value or ":" not in value:
        return None
    code, _, sig = value.partition(":")
    try:
        return -int(sig) if int(sig) else int(code)
    except ValueError:
        return None


def _seconds(value: str | None) -> float | None:
    """Slurm's [D-]HH:MM:SS, MM:SS or minutes as seconds; None for UNLIMITED, INVALID or nothing."""
    if not value or not value[0].isdigit():
        return None
    days, _, clock = value.rpartition("-")
    parts = [int(p) for p in clock.split(":") if p.isdigit()]
    if len(parts) == 1:
        parts = [0, parts[0], 0]  # plain minutes
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts[-3:]
    return (int(days) if days.isdigit() else 0) * 86_400 + hours * 3600 + minutes * 60 + seconds
