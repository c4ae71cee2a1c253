"""Weights & Biases in a job given no W&B key: offline, so a script that calls ``wandb.init()`` runs unchanged.

Without a key, ``wandb.init()`` in a process with no terminal raises "No API key configured" and the job fails
before its first step; with one but no route to the W&B server, it waits and fails. Offline, wandb writes the
run under the script's working directory (``wandb/offline-run-*``): its metrics become the job's
(worker/wandb_tail.py), and the directory is in the job's artifacts for ``wandb sync`` later. A key in the job's
secrets (or the worker's environment) or a ``WANDB_MODE`` of the job's own is left as it is.
"""

from __future__ import annotations

from collections.abc import Mapping

OFFLINE = {"WANDB_MODE": "offline"}
# Any of these says the job (or the operator) chose how wandb runs.
CHOSEN = ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DISABLED")


def wandb_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """What the ranks' environment ``env`` gets added for wandb (pure)."""
    return {} if any(name in env for name in CHOSEN) else dict(OFFLINE)
