"""How many examples a property test tries: its own count in a full run (`make test`, what CI runs), a quarter of it
in the quick loop (`-m "not slow"`), which is the minute between an edit and its answer, not the search for a rare
case. Hypothesis' own advice: a small profile while developing, the full one in CI."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

QUICK_SHARE = 0.25
_quick = {"on": False}

# No test asserts on wall time, Hypothesis's 200 ms deadline and its too-slow health check included: the suite runs
# three files at a time beside real training ranks, where a pure check took 252 ms on its first call and 0.02 ms on
# the next, which Hypothesis reports as a flaky failure. A test's own @settings still sets anything else it needs.
hypothesis_settings.register_profile("torchyard", deadline=None, suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.register_profile("torchyard-quick", parent=hypothesis_settings.get_profile("torchyard"),
                                     max_examples=round(100 * QUICK_SHARE))
hypothesis_settings.load_profile("torchyard")


def is_quick(config: pytest.Config) -> bool:
    """Whether this run leaves the slow tests out: the quick loop."""
    return "not slow" in (config.getoption("markexpr") or "")


def configure(config: pytest.Config) -> None:
    """Before any test module is imported (their settings are made at import)."""
    _quick["on"] = is_quick(config)
    hypothesis_settings.load_profile("torchyard-quick" if _quick["on"] else "torchyard")


def quick() -> bool:
    """Whether this is the quick loop (set once the run is configured)."""
    return _quick["on"]


def examples(full: int) -> int:
    """``full`` in a full run, a quarter of it (at least 10) in the quick loop."""
    return max(10, round(full * QUICK_SHARE)) if quick() else full
