"""Progress bars redrawn with \\r become lines of the merged log, at most one per PROGRESS_EVERY_S."""

from __future__ import annotations

import os
from pathlib import Path

from trainer.rank_output import PROGRESS_EVERY_S, _Merged


def test_redraws_become_rate_limited_lines_and_the_last_draw_always_shows(tmp_path: Path) -> None:
    log = tmp_path / "ranks.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    now = [100.0]
    merged = _Merged(fd, b"[rank 0] ", clock=lambda: now[0])
    merged.write(b"Epoch 0\n")
    for i in range(1, 6):  # five redraws within one period: only the first is shown now
        merged.write(f"\r 2{i}%|##  | {i}/10".encode())
        now[0] += PROGRESS_EVERY_S / 10
    now[0] += PROGRESS_EVERY_S
    merged.write(b"\r 70%|###  | 7/10")  # the draw before it (5/10) is shown: a period has passed
    merged.write(b"\r100%|#####| 10/10\n")  # the bar's final state ends the line: always written
    merged.write(b"done\r\n")
    merged.write(b"\rtrailing update")
    merged.close()
    os.close(fd)
    assert log.read_text().splitlines() == [
        "[rank 0] Epoch 0", "[rank 0]  21%|##  | 1/10", "[rank 0]  25%|##  | 5/10", "[rank 0] 100%|#####| 10/10",
        "[rank 0] done", "[rank 0] trailing update",
    ]
