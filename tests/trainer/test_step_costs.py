"""What the step's cost trims must not change: the loss a task reports, and the system metrics a report carries."""

from __future__ import annotations

import mmap
import time

import pytest
import torch
import torch.nn.functional as F

from trainer import tasks
from trainer.system_metrics import CPU_NAMES, SystemSampler


@pytest.mark.parametrize("shape", [(8, 5), (4, 6, 5)])
def test_the_training_loss_is_the_mean_cross_entropy_over_every_position(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    out = torch.randn(*shape, requires_grad=True)
    y = torch.randint(0, shape[-1], shape[:-1])
    loss = tasks.train_loss("classification" if len(shape) == 2 else "lm", out, y)
    expected = F.cross_entropy(out.detach().reshape(-1, shape[-1]), y.reshape(-1))
    assert torch.allclose(loss.detach(), expected)
    loss.backward()
    assert out.grad is not None and out.grad.shape == out.shape


def test_a_classification_label_column_is_read_as_labels() -> None:
    out, y = torch.randn(6, 3), torch.tensor([[0], [1], [2], [0], [1], [2]])
    assert torch.allclose(tasks.train_loss("classification", out, y), F.cross_entropy(out, y.view(-1)))


def test_the_system_sampler_reads_at_most_once_an_interval() -> None:
    sampler = SystemSampler(torch.device("cpu"), min_interval_s=0.2)
    first = sampler.sample()
    assert len(first) == len(sampler.names) and first[CPU_NAMES.index("sys/rss_bytes")] > 10e6
    assert sampler.sample() is first  # within the interval: the same reading, no syscall
    # The next reading must see this process grow: fresh anonymous pages, each written once (a bytearray's memory can
    # come from what malloc already holds resident after earlier tests in this process: CI once saw no growth).
    ballast = mmap.mmap(-1, 64 << 20)
    for page in range(0, len(ballast), mmap.PAGESIZE):
        ballast[page] = 1
    time.sleep(0.25)
    again = sampler.sample()
    assert again is not first
    assert sampler.rss_bytes == again[CPU_NAMES.index("sys/rss_bytes")] >= first[CPU_NAMES.index("sys/rss_bytes")] + (60 << 20)
    del ballast
