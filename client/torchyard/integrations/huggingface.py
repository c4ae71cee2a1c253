"""``Trainer(..., callbacks=[HuggingFaceCallback()])``: what the Hugging Face Trainer logs into torchyard at
its own logging steps, and each ``checkpoint-N`` directory once the Trainer has saved it."""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from torchyard import report
from torchyard.integrations import numbers


class HuggingFaceCallback(TrainerCallback):  # type: ignore[misc]
    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        values = numbers(logs)
        if values and state.is_world_process_zero:
            report.metrics(int(state.global_step), values, epoch=int(state.epoch or 0))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Called after the Trainer wrote checkpoint-N (trainer_state.json included).
        if state.is_world_process_zero:
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            report.checkpoint(path, int(state.global_step), epoch=int(state.epoch or 0))
