# syntax=docker/dockerfile:1
# torchyard worker: an RQ worker that supervises torchrun, with the trainer and CUDA PyTorch.
# Build from the repository root:
#   docker build -f docker/worker.Dockerfile -t torchyard-worker .                              # CUDA 12.8 (default)
#   docker build -f docker/worker.Dockerfile --build-arg TORCH_VARIANT=cpu -t torchyard-worker:cpu .   # no GPU
#
# The CUDA wheels from the PyTorch index carry the CUDA runtime, cuDNN, cuBLAS and NCCL as pip
# packages (nvidia-*), so a plain Python base is enough: the host contributes only the driver,
# injected by the NVIDIA Container Toolkit. torch 2.13.0+cu128 needs NVIDIA driver >= 570.26
# (docs/deploy.md, "GPU driver"); TORCH_VARIANT=cu126 is the fallback for R560 drivers.

ARG PYTHON_VERSION=3.11

# ---- build: a wheel of the project, so the runtime stage holds no source tree or build tools
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api ./api
COPY jobs ./jobs
COPY worker ./worker
COPY trainer ./trainer
COPY dashboard ./dashboard
RUN pip wheel --no-deps --wheel-dir /wheels .

# ---- runtime
FROM python:${PYTHON_VERSION}-slim-bookworm
# The torch pin must equal pyproject.toml's (tests/deploy/test_requirements.py checks it).
ARG TORCH_VERSION=2.13.0
# cu128 | cu126 | cpu: the PyTorch wheel index to install torch from.
ARG TORCH_VARIANT=cu128
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    TORCHYARD_RUNS_DIR=/var/lib/torchyard/runs \
    TORCHYARD_DATA_DIR=/var/lib/torchyard/data \
    TORCHYARD_CODE_DIR=/var/lib/torchyard/code

# Same numeric ids as the api image: both write the shared runs volume. The directories exist in
# the image, owned by that user, because Docker seeds an empty named volume from them.
RUN groupadd --system --gid 10001 torchyard \
    && useradd --system --uid 10001 --gid torchyard --create-home --home-dir /home/torchyard torchyard \
    && mkdir -p /var/lib/torchyard/runs /var/lib/torchyard/data /var/lib/torchyard/code \
    && chown -R torchyard:torchyard /var/lib/torchyard

# torch alone and first: the largest layer (several GB with CUDA) and the one that changes least.
# Only the PyTorch index is used, so pip can never pick a PyPI torch built for another CUDA.
RUN pip install --no-cache-dir --index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}" "torch==${TORCH_VERSION}"

COPY docker/requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir -r /tmp/requirements.txt && rm /tmp/requirements.txt

COPY --from=build /wheels /tmp/wheels
# --no-deps: torch is already here from the right index. pip check proves the set is consistent,
# and the imports fail the build, not the first job, if anything is missing.
RUN pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && pip check \
    && python -c "import torch, torch.distributed.run, trainer.engine, worker.supervisor; print(torch.__version__, torch.version.cuda)"

USER 10001:10001
WORKDIR /home/torchyard

# SIGTERM is what `docker compose stop` sends; compose's stop_grace_period gives the running
# job time to checkpoint before SIGKILL.
STOPSIGNAL SIGTERM
CMD ["python", "-m", "worker"]
