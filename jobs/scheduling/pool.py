"""Free units (GPUs or CPU slots) per live host, bucketed by how many are free.

Best fit is then a bisect over a handful of free counts instead of a scan of every host, which is
what keeps one pass over thousands of hosts and jobs within milliseconds. Hosts are numbered by
their place in id order; within a bucket the lowest number comes first, so ties break by host id.
"""

from __future__ import annotations

from bisect import bisect_left, insort


class Pool:
    """Free and total units of the hosts that have any (``totals[h] > 0``), indexed by host number."""

    def __init__(self, free: list[int], totals: list[int]):
        self.free = free
        self.totals = totals
        self.buckets: dict[int, list[int]] = {}
        self.whole: list[tuple[int, int]] = []  # (total, host) of hosts with every unit free
        for h, (f, t) in enumerate(zip(free, totals, strict=True)):
            if t > 0:
                self.buckets.setdefault(f, []).append(h)
                if f == t:
                    self.whole.append((t, h))
        self.whole.sort()
        self.levels = sorted(f for f in self.buckets if f > 0)

    def copy(self) -> Pool:
        other = Pool.__new__(Pool)
        other.free, other.totals = list(self.free), self.totals
        other.buckets = {f: list(b) for f, b in self.buckets.items()}
        other.whole, other.levels = list(self.whole), list(self.levels)
        return other

    # ------------------------------------------------------------------ questions

    def most_free(self) -> tuple[int, int] | None:
        """(host, free) of the host with the most free units, lowest host number among equals."""
        if not self.levels:
            return None
        top = self.levels[-1]
        return self.buckets[top][0], top

    def largest(self) -> tuple[int, int] | None:
        """(host, total) of the host with the most units, lowest host number among equals."""
        best: tuple[int, int] | None = None
        for h, t in enumerate(self.totals):
            if t > 0 and (best is None or t > best[1]):
                best = (h, t)
        return best

    def count_at_least(self, n: int) -> int:
        levels = self.levels
        return sum(len(self.buckets[f]) for f in levels[bisect_left(levels, n):])

    def hosts_with_units(self) -> int:
        return sum(len(b) for b in self.buckets.values())

    # ------------------------------------------------------------------ best fit

    def best_fit(self, n: int, k: int) -> list[int] | None:
        """``k`` distinct hosts with at least ``n`` free units each, the fewest free first; None if
        fewer than ``k`` have them."""
        levels = self.levels
        i = bisect_left(levels, n)
        if k == 1:
            return [self.buckets[levels[i]][0]] if i < len(levels) else None
        chosen: list[int] = []
        for f in levels[i:]:
            chosen.extend(self.buckets[f][:k - len(chosen)])
            if len(chosen) == k:
                return chosen
        return None

    def whole_hosts(self, k: int) -> list[int] | None:
        """``k`` hosts with every unit free, the smallest first (so a larger host stays whole)."""
        if len(self.whole) < k:
            return None
        return [h for _, h in self.whole[:k]]

    # ------------------------------------------------------------------ change

    def take(self, h: int, n: int) -> None:
        self._move(h, self.free[h], self.free[h] - n)

    def give(self, h: int, n: int) -> None:
        """Units that were taken during the pass come free again (a reservation let go)."""
        self._move(h, self.free[h], self.free[h] + n)
        if self.free[h] == self.totals[h]:
            insort(self.whole, (self.totals[h], h))

    def _move(self, h: int, old: int, new: int) -> None:
        bucket = self.buckets[old]
        del bucket[bisect_left(bucket, h)]
        if not bucket:
            del self.buckets[old]
            if old > 0:
                del self.levels[bisect_left(self.levels, old)]
        if old == self.totals[h]:
            del self.whole[bisect_left(self.whole, (old, h))]
        target = self.buckets.get(new)
        if target is None:
            self.buckets[new] = [h]
            if new > 0:
                insort(self.levels, new)
        else:
            insort(target, h)
        self.free[h] = new
