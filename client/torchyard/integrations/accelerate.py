"""``Accelerator(log_with=[AccelerateTracker()])``: ``accelerator.log(values, step=N)`` into torchyard."""

from __future__ import annotations

from typing import Any

from accelerate.tracking import GeneralTracker

from torchyard import report
from torchyard.integrations import numbers


class AccelerateTracker(GeneralTracker):  # type: ignore[misc]
    name = "torchyard"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, run_name: str = "torchyard"):
        super().__init__()
        self.run_name = run_name
        self._step = 0

    @property
    def tracker(self) -> Any:
        return report

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Hyperparameters stay in the job's spec and args; nothing to store here."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self._step = self._step + 1 if step is None else int(step)
        found = numbers(values)
        if found:
            report.metrics(self._step, found)

    def finish(self) -> None:
        report.close()
