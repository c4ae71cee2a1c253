"""Which GPU indices of one host a job gets: keep the free ones in contiguous runs.

Neighbouring indices usually share the faster links (NVLink pairs and quads), and a later job that
asks for a block wants it unbroken. So a job takes from the shortest free run that holds it whole,
at an offset aligned to its size where the run allows (a 2-GPU job on 2,3 rather than 1,2); when no
run holds it, it takes the shortest runs first and leaves the longest ones whole.
"""

from __future__ import annotations

from collections.abc import Sequence


def runs(free: Sequence[int]) -> list[tuple[int, int]]:
    """(start position in ``free``, length) of each run of consecutive indices; ``free`` is sorted."""
    out: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(free) + 1):
        if i == len(free) or free[i] != free[i - 1] + 1:
            out.append((start, i - start))
            start = i
    return out


def _alignment(n: int) -> int:
    return 1 << (n - 1).bit_length()


def choose(free: Sequence[int], n: int) -> tuple[int, ...]:
    """``n`` of the sorted free indices ``free`` (``len(free) >= n``), as a sorted tuple."""
    if n == len(free):
        return tuple(free)
    if free[-1] - free[0] == len(free) - 1:  # one run, the common case on a host that packs well
        align = _alignment(n)
        first = -free[0] % align
        return tuple(free[first:first + n]) if first + n <= len(free) else tuple(free[:n])
    all_runs = runs(free)
    fitting = [r for r in all_runs if r[1] >= n]
    if fitting:
        start, length = min(fitting, key=lambda r: (r[1], r[0]))
        align = _alignment(n)
        for pos in range(start, start + length - n + 1):
            if free[pos] % align == 0:
                return tuple(free[pos:pos + n])
        return tuple(free[start:start + n])
    taken: list[int] = []
    for start, length in sorted(all_runs, key=lambda r: (r[1], r[0])):
        taken.extend(free[start:start + min(length, n - len(taken))])
        if len(taken) == n:
            break
    return tuple(sorted(taken))


def largest_run(free: Sequence[int]) -> int:
    return max((length for _, length in runs(free)), default=0)
