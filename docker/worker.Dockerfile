# syntax=docker/dockerfile:1
# torchyard worker: an RQ worker that supervises torchrun, with the trainer and CUDA PyTorch.
# Build from the repository root:
#   docker build -f docker/worker.Dockerfile -t torchyard-worker .                              # CUDA 12.8 (default)
#   docker build -f docker/worker.Dockerfile --build-arg TORCH_VARIANT=cpu -t torchyard-worker:cpu .   # no GPU
#   ... --build-arg TORCH_INDEX_URL=https://mirror.example/pytorch/whl/cu128                       # behind a mirror
#
# The CUDA wheels from the PyTorch index carry the CUDA runtime, cuDNN, cuBLAS and NCCL as pip
# packages (nvidia-*), so a plain Python base is enough: the host contributes only the driver,
# injected by the NVIDIA Container Toolkit. torch 2.13.0+cu128 needs NVIDIA driver >= 570.26
# (docs/deploy.md, "GPU driver"); TORCH_VARIANT=cu126 is the fallback for R560 drivers.

ARG PYTHON_VERSION=3.11

# ---- build: wheels of the service (torchyard-server) and its client (client/), so the runtime stage holds no
# source tree or build tools
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api ./api
COPY client ./client
COPY jobs ./jobs
COPY jobspec ./jobspec
COPY worker ./worker
COPY trainer ./trainer
COPY manifests ./manifests
COPY dashboard ./dashboard
RUN pip wheel --no-deps --wheel-dir /wheels . ./client

# ---- runtime
FROM python:${PYTHON_VERSION}-slim-bookworm
# The torch pin must equal pyproject.toml's (tests/deploy/test_requirements.py checks it).
ARG TORCH_VERSION=2.13.0
# cu128 | cu126 | cpu: which torch build to install.
ARG TORCH_VARIANT=cu128
# Where torch comes from. Empty: the PyTorch index of TORCH_VARIANT,
# https://download.pytorch.org/whl/${TORCH_VARIANT}. Behind a mirror, its URL for that variant.
ARG TORCH_INDEX_URL=
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

# train.compile: TorchInductor compiles C++ for the CPU and Triton compiles a C launcher for the GPU,
# both against Python's headers. The official Python images ship the headers; a base whose Python is
# Debian's own does not, so python3-dev is added only there. Unpinned: Debian's stable security
# updates replace old package versions on the mirror, so a pin would break the build.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc g++ \
    && if ! python -c "import os, sys, sysconfig; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"; then \
         apt-get install -y --no-install-recommends python3-dev; fi \
    && rm -rf /var/lib/apt/lists/*

# torch alone and first: the largest layer (several GB with CUDA) and the one that changes least.
# Only the PyTorch index (or its mirror) is used, so pip can never pick a PyPI torch built for another CUDA.
# The index is recorded beside the interpreter: a job's requirements built against torch (torchvision ...) resolve
# from it, as this torch build (worker/torch_builds.py).
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/${TORCH_VARIANT}}" "torch==${TORCH_VERSION}" \
    && echo "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/${TORCH_VARIANT}}" > "$(python -c 'import sys; print(sys.prefix)')/torchyard-torch-index-url"

# The compiler toolchain works with this torch: one tiny torch.compile on the CPU (about 30 s, cached
# with the layers above, so it reruns only when torch or the compiler changes).
RUN python -c "import torch; f = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2); assert torch.allclose(f(torch.ones(4)), torch.nn.functional.gelu(torch.ones(4)) * 2)" \
    && rm -rf /tmp/torchinductor_*

COPY docker/requirements.txt docker/worker-requirements.txt /tmp/
RUN pip install --no-cache-dir -r /tmp/requirements.txt -r /tmp/worker-requirements.txt \
    && rm /tmp/requirements.txt /tmp/worker-requirements.txt

COPY --from=build /wheels /tmp/wheels
# --no-deps: torch is already here from the right index. pip check proves the set is consistent.
RUN pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && pip check \
    && python -c "import torch, torch.distributed.run, trainer.loop, worker.supervisor, torch.utils.tensorboard, mlflow, pynvml; print(torch.__version__, torch.version.cuda)"

USER 10001:10001
WORKDIR /home/torchyard

# Fail the build, not a user's first job: every catalog model, data format and checkpoint path
# (DCP save and async save in a gloo process group, resume, safetensors weights, load_model)
# trains for two steps, as the user the worker runs as. About 10 s.
RUN python -m trainer.selfcheck

# SIGTERM is what `docker compose stop` sends; compose's stop_grace_period gives the running
# job time to checkpoint before SIGKILL.
STOPSIGNAL SIGTERM
CMD ["python", "-m", "worker"]
