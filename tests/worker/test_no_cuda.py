"""A CUDA-only script on a host without CUDA: the job's error says what happened and how to ask for GPUs, with
torch's own error kept under it; every other CUDA error (a device fault) reaches the operator as it is."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import Services
from worker.outcome import NO_CUDA_ADVICE, last_error, no_cuda_message


@pytest.fixture
def database_url(sqlite_url: str) -> str:
    return sqlite_url


NO_CUDA = [
    "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'",
    "AttributeError: module 'torch._C' has no attribute '_cuda_getDeviceCount'",
    "AssertionError: Torch not compiled with CUDA enabled",
    "RuntimeError: No CUDA GPUs are available",
    "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver",
    "RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!",
    "RuntimeError: Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is False.",
]
DEVICE_FAULTS = [
    "RuntimeError: CUDA error: uncorrectable ECC error encountered",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error",
    "AttributeError: module 'torch._C' has no attribute 'frobnicate'",
]


@pytest.mark.parametrize("error", NO_CUDA)
def test_torchs_no_cuda_words_get_the_advice_and_keep_the_raw_error(error: str) -> None:
    summary = f"rank 0: {error}"
    said = no_cuda_message(summary, f"Traceback (most recent call last):\n  File \"train.py\", line 3\n{error}")
    first, raw = said.split("\n", 1)
    assert first == NO_CUDA_ADVICE and raw == summary
    # A plain script's summary is its exit code: torch's line goes under it.
    assert no_cuda_message("rank 0 exited with code 1", f"x\n{error}\n") == f"{NO_CUDA_ADVICE}\nrank 0 exited with code 1\n{error}"
    assert "parallel.device: cuda" in first and "has none" in first
    assert no_cuda_message(said, error) == said  # said once


@given(fault=st.sampled_from(DEVICE_FAULTS), noise=st.text(max_size=40).filter(lambda t: "cuda" not in t.lower()))
def test_other_cuda_errors_are_never_rewritten(fault: str, noise: str) -> None:
    summary = f"rank 1: {fault}"
    assert no_cuda_message(summary, f"{noise}\n{fault}") == summary


def test_a_no_driver_warning_before_another_error_is_not_the_error() -> None:
    log = ("UserWarning: CUDA initialization: Found no NVIDIA driver on your system.\n"
           "Traceback (most recent call last):\n  File \"train.py\", line 9\nValueError: bad batch")
    assert last_error(log).startswith("Traceback") and "NVIDIA" not in last_error(log)
    assert no_cuda_message("rank 0: ValueError: bad batch", last_error(log)) == "rank 0: ValueError: bad batch"


@pytest.mark.slow
def test_a_script_calling_set_device_on_a_cpu_host_fails_saying_it_needs_cuda(services: Services, tmp_path: Path) -> None:
    (services.settings.code_dir / "cuda_only.py").write_text("import torch\ntorch.cuda.set_device(0)\n")
    services.start_api()
    services.start_worker()
    with services.client() as client:
        created = client.post("/v1/jobs", json={"kind": "script", "name": "cuda-only", "entrypoint": "cuda_only.py"})
        assert created.status_code == 201, created.text
        job = services.wait_status(client, created.json()["id"], {"succeeded", "failed", "cancelled"}, timeout_s=180)
    assert job["status"] == "failed"
    first, raw = job["error"]["message"].split("\n", 1)
    assert first == NO_CUDA_ADVICE
    assert raw == "rank 0 exited with code 1; torchrun exited with code 1\n" \
                  "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'", raw
    assert "_cuda_setDevice" in job["error"]["log_tail"]
