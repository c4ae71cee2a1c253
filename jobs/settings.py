"""All configuration, from ``TORCHYARD_*`` environment variables. No other module reads the environment for settings."""

from __future__ import annotations

import os
import shlex
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from cryptography.fernet import Fernet, MultiFernet
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from jobspec.spec import SpecLimits

# Operator-chosen sbatch options that cannot change what torchyard relies on (one task per node, the
# time limit and signal, --no-requeue, where output goes, which environment the ranks get).
SBATCH_ALLOWED_OPTIONS = frozenset({
    "--qos", "--reservation", "--constraint", "--exclude", "--nodelist", "--mem", "--mem-per-cpu", "--mem-per-gpu", "--gres",
    "--exclusive", "--comment", "--wckey", "--licenses", "--tmp", "--nice", "--hint", "--switches", "--cluster-constraint",
    "--gpu-bind", "--gpu-freq", "--cpu-freq", "--network", "--core-spec", "--prefer", "--mail-type", "--mail-user",
})


def fernet_from(keys: str) -> MultiFernet:
    """The cipher of a comma-separated key list; ValueError (never quoting a key) when one is malformed."""
    parts = [k.strip() for k in keys.split(",") if k.strip()]
    if not parts:
        raise ValueError("TORCHYARD_SECRETS_KEY is empty")
    ciphers = []
    for i, key in enumerate(parts):
        try:
            ciphers.append(Fernet(key))
        except ValueError:
            raise ValueError(f"TORCHYARD_SECRETS_KEY: key {i + 1} is not a Fernet key (32 url-safe base64-encoded bytes; "
                             "make one with: python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())')"
                             ) from None
    return MultiFernet(ciphers)


class Settings(BaseSettings):
    # Errors never echo a value: several settings carry credentials (database URL, tokens, the secrets key).
    model_config = SettingsConfigDict(env_prefix="TORCHYARD_", env_file=None, extra="ignore", hide_input_in_errors=True)

    database_url: str = Field("sqlite:///./var/torchyard.db", description="SQLAlchemy URL; PostgreSQL as postgresql+psycopg://...")
    redis_url: str = "redis://localhost:6379/0"
    runs_dir: Path = Path("./var/runs")
    data_dir: Path = Path("./var/data")
    code_dir: Path = Path("./var/code")
    bundles_dir: Path | None = Field(
        None, description="Uploaded code bundles (POST /v1/code); every API and worker must see it. Default: RUNS_DIR/.bundles.")
    max_code_bytes: int = Field(100 * 1024 * 1024, ge=1024, description="Largest code bundle (the tar); larger uploads answer 413.")
    max_code_unpacked_bytes: int = Field(1024 ** 3, ge=1024, description=(
        "Most bytes a code bundle may unpack to, every file counted at its full size (sparse ones too); more answers 413."))
    venvs_dir: Path | None = Field(
        None, description="Cached per-job Python environments (spec requirements). Default: RUNS_DIR/.venvs, shared by the workers.")
    requirements_timeout_s: float = Field(900.0, gt=0, description="Time limit of building one requirements environment.")
    requirements_only_binary: bool = Field(
        True, description="Install requirements from wheels only: no package's build script runs on a worker.")
    torch_index_url: str | None = Field(
        None, description="The package index the worker's torch build comes from (https://download.pytorch.org/whl/cpu, cu128, a "
                          "mirror): a job's requirements built against torch (torchvision, torchaudio ...) resolve from it too. "
                          "Default: the index `make install TORCH_INDEX_URL=...` or the worker image recorded beside torch.")
    admin_token: str | None = Field(None, description="Bearer token of the admin owner; required by the API.")
    mlflow_tracking_uri: str | None = Field(
        None, description="MLflow tracking server (http(s)://...) every job's rank 0 logs params, metrics and final weights to; "
                          "passed to the ranks by the worker. Unset: no MLflow.")

    worker_queues: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["default"])
    worker_id: str | None = Field(None, description="Defaults to hostname:pid.")
    max_nproc_per_node: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1)
    max_nnodes: int = Field(64, ge=1)
    worker_gpus: int | None = Field(None, ge=0, le=1024, description="GPUs this worker gives its jobs (parallel.nproc_per_node 'gpu' "
                                                                     "and the check that ranks <= GPUs); default: counted on the host.")
    worker_cpu_slots: int | None = Field(None, ge=0, le=4096, description="CPU slots this worker's host gives device-cpu jobs "
                                                                          "(one per rank); default: the host's core count.")

    lease_ttl_s: float = Field(30.0, gt=0)
    poll_interval_s: float = Field(0.5, gt=0, description="Supervisor loop period: tail events, heartbeat, check cancel.")
    stop_grace_s: float = Field(30.0, ge=0, description="SIGTERM to SIGKILL, time for the trainer to checkpoint.")
    ingest_batch: int = Field(500, ge=1)
    max_worker_losses: int = Field(3, ge=0, description="Lost workers a job survives (requeued, no retry spent) before it fails.")
    run_retention_days: float | None = Field(
        None, gt=0, description="Run directories of jobs finished longer ago than this many days are removed "
                                "(the job's rows stay); unset: kept for good.")
    run_retention_keep_weights: bool = Field(
        False, description="When a run directory expires, keep its final consolidated weights file.")
    # Object storage (jobs/storage/, docs/deploy.md "Several hosts without shared storage").
    storage_url: str | None = Field(
        None, description="s3://BUCKET[/PREFIX]: workers upload checkpoints (once complete), events, logs, final weights and "
                          "artifacts there, and a job resumed on another host downloads its checkpoint from there. Region and "
                          "credentials: the usual AWS_* variables (boto3). Unset: the runs directory only.")
    s3_endpoint_url: str | None = Field(None, description="Endpoint of an S3-compatible server (http://seaweedfs:8333); "
                                                          "unset: AWS S3.")
    storage_sync_interval_s: float = Field(5.0, gt=0, le=300, description="How often a worker uploads a running job's "
                                                                          "events and logs, and looks for new checkpoints.")
    clock_offset_s: float = Field(0.0, description="Skews this process's own wall clock (tests of clock skew); leases use "
                                                   "the database's clock and are unaffected.")

    # PostgreSQL connections (jobs/store/db.py): a silent partition must end in an error, not a hang.
    db_connect_timeout_s: int = Field(5, ge=1, description="Seconds to establish a PostgreSQL connection.")
    db_statement_timeout_s: float = Field(60.0, ge=0, description="Longest statement; 0: no limit.")
    db_idle_in_transaction_timeout_s: float = Field(
        300.0, ge=0, description="A session idle this long inside a transaction is ended by the server: a worker frozen "
                                 "mid-write (a paused VM) would otherwise hold its job's row lock, and the requeue of "
                                 "its lapsed lease would wait for it forever; 0: no limit.")
    db_keepalive_idle_s: int = Field(10, ge=1, description="TCP keepalive: idle seconds before the first probe.")
    db_keepalive_interval_s: int = Field(5, ge=1, description="TCP keepalive: seconds between probes.")
    db_keepalive_count: int = Field(3, ge=1, description="TCP keepalive: unanswered probes before the connection is dead.")

    # Multi-node jobs (worker/node.py, docs/multinode.md).
    worker_host: str | None = Field(
        None, description="Address other workers reach this one at (rendezvous endpoint of the gangs it leads); "
                          "default: this host name's address.")
    gang_join_timeout_s: float = Field(60.0, gt=0, description="torchrun's c10d rendezvous join timeout on every node.")
    rendezvous_ports: Annotated[tuple[int, int], NoDecode] = Field(
        (20000, 29999), description="Ports LOW-HIGH node 0 of a gang picks its c10d rendezvous port from (open them "
                                    "between the hosts). Below Linux's ephemeral ports (32768-60999) by default: an "
                                    "outgoing connection cannot take the port between the pick and torchrun's bind.")

    # Where the ranks run (worker/executors/, docs/slurm.md).
    executor: Literal["local", "slurm"] = Field("local", description="local: torchrun on this worker's host; slurm: sbatch per attempt.")
    slurm_partition: str | None = Field(None, description="sbatch --partition; default: the cluster's default partition.")
    slurm_account: str | None = Field(None, description="sbatch --account.")
    slurm_sbatch_args: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Further sbatch options, shell-quoted, each one of SBATCH_ALLOWED_OPTIONS "
                                          "(e.g. '--qos=high --constraint=a100').")
    slurm_bin_dir: Path | None = Field(None, description="Directory of sbatch, squeue, scontrol, sacct and scancel; default: PATH.")
    slurm_conf: Path | None = Field(None, description="slurm.conf the Slurm commands read (SLURM_CONF); default: theirs.")
    slurm_cpus_per_rank: int = Field(4, ge=1, le=256, description="CPUs Slurm gives each rank: --cpus-per-task is this "
                                                                  "times nproc_per_node (one task per node).")
    slurm_gpus: bool = Field(True, description="Jobs with device auto ask Slurm for nproc_per_node GPUs per node; false on "
                                               "CPU-only clusters (device cuda always asks, device cpu never).")
    slurm_poll_interval_s: float = Field(5.0, gt=0, description="How often the worker asks Slurm about a job it runs.")

    # Job isolation (worker/sandbox/job_users.py, docs/security.md).
    job_uids: tuple[int, int] | None = Field(
        None, description="Range of uids (and equal gids) the worker runs jobs as, one per running job, e.g. 20000-29999; "
                          "unset: jobs run as the worker's own user.")
    fork_ranks: bool = Field(True, description="Catalog jobs' ranks are forked from torchrun, which has imported torch "
                                               "already, instead of each importing it again (docs/trainer.md); false: "
                                               "each rank is a fresh interpreter, as script jobs' always are.")
    single_user: bool = Field(False, description="A worker running jobs as its own user accepts jobs of every owner; "
                                                 "false: only jobs of the first owner it ran.")

    # HTTP API limits and streaming (api/).
    max_request_bytes: int = Field(1_048_576, ge=1024, description="Request bodies above this many bytes answer 413.")
    max_queued_per_owner: int = Field(1000, ge=1, description="Queued jobs one owner may have; more submissions answer 429.")
    max_running_per_owner: int = Field(100, ge=1, description="Running jobs one owner may have; further jobs wait in the queue.")
    preempt_min_runtime_s: float = Field(300.0, ge=0, description="A job younger than this is never preempted.")
    gpu_fault_limit: int = Field(2, ge=1, description="Device faults on one GPU, without a success between them, that "
                                 "quarantine it (jobs/hosts/gpu_faults.py) until an admin clears it.")
    gpu_fault_patterns: str = Field("", description="More device-fault messages, as case-insensitive regular expressions "
                                    "separated by ';', on top of jobs/hosts/gpu_faults.py's list.")
    host_health_cmd: str | None = Field(None, description="A command the worker runs every TORCHYARD_HOST_HEALTH_INTERVAL_S; "
                                        "a non-zero exit drains its host, the next zero exit undrains it.")
    host_health_interval_s: float = Field(60.0, gt=0)
    key_cache_s: float = Field(
        5.0, ge=0, le=300, description="How long an API process trusts a tenant key it has verified without asking SQL again: a "
        "key revoked through another API process stops working within this bound (at once in the process that revoked it). "
        "0 asks SQL on every request.")
    read_threads: int = Field(4, ge=1, le=256, description=(
        "Threads that run the hot read routes (GET /v1/jobs/{id}) and, on PostgreSQL, the async connections they use."))
    sse_poll_interval_s: float = Field(0.5, gt=0, le=60, description="How often event and log streams poll SQL and files.")
    log_format: Literal["json", "text"] = Field("json", description="json: one object per line with job_id and request_id.")

    # Tenants (docs/security.md).
    queues: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["default"], min_length=1,
        description="Comma list of the queues that exist; a job for any other queue is refused (422). "
                    "An API key may be narrowed to some of them.")
    script_modules: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma list of installed modules a script job may run as its entrypoint (exact dotted names); "
                    "empty: only code under the code root runs.")
    secrets_key: SecretStr | None = Field(
        None, description="Fernet key(s) that encrypt job secrets at rest, comma-separated: the first encrypts, all decrypt "
                          "(rotation). Unset: specs with secrets are refused. API and workers need the same value.")
    max_streams_per_owner: int = Field(8, ge=1, description="Open /events and followed /logs streams one owner may hold "
                                                            "in one API process; more answer 429.")
    stream_max_lifetime_s: float = Field(900.0, gt=0, description="An /events stream or a followed /logs ends after this "
                                                                  "long with a 'reconnect' message; clients resume with "
                                                                  "Last-Event-ID (events) or its position (logs).")

    # Webhooks (jobs/webhooks/, docs/operations.md).
    public_url: str | None = Field(None, description="The dashboard's address as people reach it (https://torchyard.example); "
                                                     "slack webhook messages link to the job there. Unset: no link.")
    webhook_allow_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma list of host names and CIDRs webhooks may post to although they are "
                                          "loopback, private, link-local or metadata addresses (every key's webhooks).")
    webhook_max_tries: int = Field(12, ge=1, le=50, description="Tries of one delivery (the first and its retries, ~1 s "
                                                                "apart, doubling, at most 10 min): 12 outlasts ~30 minutes down.")
    webhook_timeout_s: float = Field(10.0, gt=0, le=120, description="Time limit of one webhook POST, connect to last byte.")
    webhook_threads: int = Field(8, ge=1, le=128, description="Webhook POSTs in flight at once (at most one per webhook).")
    webhook_poll_interval_s: float = Field(0.5, gt=0, le=60, description="How often the webhook sender looks for events.")

    @property
    def bundles_root(self) -> Path:
        return self.bundles_dir or self.runs_dir / ".bundles"

    @property
    def venvs_root(self) -> Path:
        return self.venvs_dir or self.runs_dir / ".venvs"

    @field_validator("worker_queues", "queues", "script_modules", "webhook_allow_hosts", mode="before")
    @classmethod
    def _split_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [q.strip() for q in value.split(",") if q.strip()]
        return value

    @field_validator("webhook_allow_hosts")
    @classmethod
    def _valid_allow_hosts(cls, value: list[str]) -> list[str]:
        from jobs.webhooks.ssrf import AllowList  # raises ValueError naming a malformed CIDR
        AllowList.parse(value)
        return value

    @field_validator("storage_url", "s3_endpoint_url", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("storage_url")
    @classmethod
    def _valid_storage_url(cls, value: str | None) -> str | None:
        if value is not None:
            from jobs.storage.url import parse  # raises StorageUrlError (a ValueError) saying what is wrong
            return str(parse(value))
        return value

    @field_validator("s3_endpoint_url")
    @classmethod
    def _valid_endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            from urllib.parse import urlsplit
            parts = urlsplit(value.strip())
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError("TORCHYARD_S3_ENDPOINT_URL must be an http:// or https:// URL of the S3 server "
                                 "(e.g. http://seaweedfs:8333)")
            if parts.username or parts.password:
                raise ValueError("TORCHYARD_S3_ENDPOINT_URL must not carry credentials: use the AWS_* variables")
            return value.strip()
        return value

    @field_validator("job_uids", mode="before")
    @classmethod
    def _uid_range(cls, value: object) -> object:
        return _range(value, "TORCHYARD_JOB_UIDS must be a range FIRST-LAST of uids, e.g. 20000-29999")

    @field_validator("rendezvous_ports", mode="before")
    @classmethod
    def _port_range(cls, value: object) -> object:
        return _range(value, "TORCHYARD_RENDEZVOUS_PORTS must be a range LOW-HIGH of ports, e.g. 20000-29999")

    @field_validator("rendezvous_ports")
    @classmethod
    def _port_range_allowed(cls, value: tuple[int, int] | None) -> tuple[int, int]:
        if value is None or not 1024 <= value[0] <= value[1] <= 65535:
            raise ValueError("TORCHYARD_RENDEZVOUS_PORTS must be LOW-HIGH with 1024 <= LOW <= HIGH <= 65535")
        return value

    @field_validator("job_uids")
    @classmethod
    def _uid_range_allowed(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is None:
            return None
        low, high = value
        if low <= 0 or high < low or high >= 2**31 - 1:
            raise ValueError("TORCHYARD_JOB_UIDS must be FIRST-LAST with 0 < FIRST <= LAST < 2147483647")
        if low <= os.getuid() <= high or low <= os.getgid() <= high:
            raise ValueError("TORCHYARD_JOB_UIDS must not include the worker's own uid or gid")
        return value

    @field_validator("slurm_sbatch_args", mode="before")
    @classmethod
    def _split_sbatch_args(cls, value: object) -> object:
        args = shlex.split(value) if isinstance(value, str) else value
        if isinstance(args, list):
            for arg in args:
                name = str(arg).split("=", 1)[0]
                if name not in SBATCH_ALLOWED_OPTIONS:
                    raise ValueError(f"sbatch option {name!r} is not allowed here; allowed: {', '.join(sorted(SBATCH_ALLOWED_OPTIONS))} "
                                     "(torchyard sets nodes, tasks, GPUs, CPUs, time, signal, requeue, output and environment itself)")
        return args

    @field_validator("secrets_key")
    @classmethod
    def _valid_fernet_keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value().strip():
            return None
        fernet_from(value.get_secret_value())  # raises ValueError naming the problem, never the key
        return value

    def spec_limits(self) -> SpecLimits:
        return SpecLimits(max_nproc_per_node=self.max_nproc_per_node, max_nnodes=self.max_nnodes, data_dir=self.data_dir,
                          code_dir=self.code_dir, script_modules=frozenset(self.script_modules), queues=frozenset(self.queues),
                          secrets_allowed=self.secrets_key is not None)


def _range(value: object, problem: str) -> object:
    """"LOW-HIGH" from the environment as (LOW, HIGH); "" as None; anything else as it is, for the field to check."""
    if not isinstance(value, str):
        return value
    if not value.strip():
        return None
    low, sep, high = value.strip().partition("-")
    if not sep or not low.strip().isdigit() or not high.strip().isdigit():
        raise ValueError(problem)
    return int(low), int(high)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
