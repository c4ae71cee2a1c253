"""Trial parameters: the grid (cartesian product, in the order the space lists values) or seeded random draws.

Trial ``n``'s parameters depend only on the sweep and ``n``, so a controller that restarts mid-sweep draws
the same trial again instead of a new one.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

from jobs.sweeps.spec import Choice, IntRange, SweepSpec, Uniform


def _values(param: Choice | IntRange) -> list[Any]:
    if isinstance(param, Choice):
        return list(param.values)
    return list(range(param.low, param.high + 1, param.step))


def grid(space: dict[str, Any]) -> list[dict[str, Any]]:
    """Every combination, the last parameter varying fastest."""
    paths = list(space)
    return [dict(zip(paths, combo, strict=True)) for combo in itertools.product(*(_values(space[p]) for p in paths))]


def draw(param: Choice | Uniform | IntRange, rng: random.Random) -> Any:
    if isinstance(param, Choice):
        return param.values[rng.randrange(len(param.values))]
    if isinstance(param, IntRange):
        return param.low + param.step * rng.randrange((param.high - param.low) // param.step + 1)
    if param.type == "loguniform":
        return math.exp(rng.uniform(math.log(param.low), math.log(param.high)))
    return rng.uniform(param.low, param.high)


def params_of(sweep: SweepSpec, number: int) -> dict[str, Any]:
    """Parameters of trial ``number`` (0-based)."""
    if sweep.grid_sampled:
        # The grid is at most MAX_GRID points: building it per call stays cheap, and keeps this a function of n.
        return grid(sweep.space)[number]
    # One generator per trial, seeded by (sweep seed, n): trial n is the same whichever trials were drawn before.
    rng = random.Random(f"{sweep.seed}:{number}")
    return {path: draw(param, rng) for path, param in sweep.space.items()}
