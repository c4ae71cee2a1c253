"""Which environment variables a job may set for its ranks (``env``) or receive as ``secrets``.

An allow-list: a name passes when it is one of ``ALLOWED_NAMES`` or starts with one of
``ALLOWED_PREFIXES``. A prefixed name is refused anyway when one of its words says it names a
place to read or write (``*_FILE``, ``*_DIR``, ``*_PATH``, ``*_HOME``, ``*_CACHE``, ...) or a program
or library to load: those are how torch, NCCL, UCX, Python and the dynamic loader are told to
write or load a file of the caller's choosing. ``env`` also refuses names that look like
credentials: they belong in ``secrets``, which are stored encrypted and never shown.

Torch-free and dependency-free: imported by the API (validation), the worker (checked again at
launch) and docs tooling alike.
"""

from __future__ import annotations

import re

NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"

# Settings of the libraries a training job uses, each one a number, a switch or an interface name.
ALLOWED_NAMES = frozenset({
    # NCCL: debugging and transport tuning (never its plugin, topology or dump files)
    "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_FAMILY", "NCCL_IB_DISABLE", "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX", "NCCL_IB_TIMEOUT", "NCCL_IB_RETRY_CNT", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE",
    "NCCL_NET_GDR_LEVEL", "NCCL_CROSS_NIC", "NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS",
    "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_NVLS_ENABLE", "NCCL_CUMEM_ENABLE", "NCCL_LAUNCH_MODE",
    "NCCL_ASYNC_ERROR_HANDLING", "NCCL_BLOCKING_WAIT",
    "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
    # torch and torch.distributed: logging levels and error handling
    "TORCH_DISTRIBUTED_DEBUG", "TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES", "TORCH_LOGS", "TORCH_USE_CUDA_DSA",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_HIGH_PRIORITY",
    "TORCH_NCCL_AVOID_RECORD_STREAMS", "TORCH_NCCL_ENABLE_MONITORING", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NO_CUDA_MEMORY_CACHING",
    "PYTORCH_NVML_BASED_CUDA_CHECK", "LOGLEVEL",
    # CUDA and math libraries
    "CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_MODULE_LOADING", "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "TOKENIZERS_PARALLELISM",
    # Python: only what changes hashing and crash reports, never what it imports
    "PYTHONHASHSEED", "PYTHONFAULTHANDLER",
})
# Weights & Biases, Hugging Face (Hub, Transformers, Accelerate), and the job's own settings (APP_*, read by your script).
ALLOWED_PREFIXES = ("WANDB_", "HF_", "TRANSFORMERS_", "ACCELERATE_", "APP_")

# Words of a name that make it a place to read or write, or code to load.
PATH_WORDS = frozenset({
    "FILE", "FILES", "DIR", "DIRS", "PATH", "PATHS", "HOME", "CACHE", "ROOT", "LOCATION", "FOLDER", "OUT", "OUTPUT",
    "TMP", "TEMP", "TMPDIR", "DUMP", "TRACE", "PLUGIN", "PLUGINS", "LIB", "LIBS", "LIBRARY", "LIBRARIES",
    "MODULE", "MODULES", "PRELOAD", "EXECUTABLE", "BIN", "BINARY", "EXEC", "CMD", "COMMAND", "SHELL", "SCRIPT", "CONFIG",
})
SECRET_WORDS = frozenset({"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIALS", "CREDENTIAL"})

# Refused with a reason of their own, so the message says why rather than "not allowed".
_RESERVED_PREFIXES = {
    "PYTHON": "PYTHON* variables change what the interpreter imports or runs at startup",
    "LD_": "LD_* variables make the dynamic loader load libraries the job did not ask for",
    "DYLD_": "DYLD_* variables make the dynamic loader load libraries the job did not ask for",
    "TORCHYARD_": "set by torchyard for every rank",
    "TORCHELASTIC_": "set by torchrun for every rank",
}
# Refused by name, each with what to do instead.
_REFUSED_NAMES = {
    "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "makes every torch.load that does not say weights_only unpickle, which runs "
                                        "code the file holds, in whatever module the job runs; refused (for a file you "
                                        "trust, pass weights_only=False to torch.load in your script)",
}
_RANK_NAMES = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "NODE_RANK",
    "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
})


def name_problem(name: str) -> str | None:
    """Why a job may not set this variable for its ranks (as ``env`` or ``secrets``), or None when it may."""
    if not re.match(NAME_PATTERN, name):
        return "names are letters, digits and '_', not starting with a digit, at most 128"
    if name in ALLOWED_NAMES:
        return None
    if name in _REFUSED_NAMES:
        return _REFUSED_NAMES[name]
    for prefix, why in _RESERVED_PREFIXES.items():
        if name.startswith(prefix):
            return f"{why}; refused"
    if name in _RANK_NAMES:
        return "ranks, rendezvous and devices are set by torchrun and the worker; refused"
    if not name.startswith(ALLOWED_PREFIXES):
        return (f"not an allowed name: use one of the names listed in docs/spec.md (env and secrets), or a name starting with "
                f"{', '.join(ALLOWED_PREFIXES)} (APP_* for your script's own settings)")
    words = set(name.upper().split("_"))
    if words & PATH_WORDS:
        return "names a file, directory or program to load or write; refused (pass paths to your script in args)"
    return None


def env_name_problem(name: str) -> str | None:
    """``name_problem``, and credentials refused: ``env`` is shown in every response, ``secrets`` are not."""
    why = name_problem(name)
    if why is None and set(name.upper().split("_")) & SECRET_WORDS:
        return "looks like a credential; put it under 'secrets', which are stored encrypted and never shown"
    return why
