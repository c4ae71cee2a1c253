# syntax=docker/dockerfile:1
# torchyard API: FastAPI + the job domain, and no torch (the API validates specs with the
# torch-free jobspec.spec and jobspec.catalog). Build from the repository root:
#   docker build -f docker/api.Dockerfile -t torchyard-api .
# It creates and migrates its tables when it starts, before it serves (api.app lifespan -> jobs.store.db.init_db),
# so there is no separate migration step to forget.

ARG PYTHON_VERSION=3.11

# ---- build: wheels of the service (torchyard-server) and its client (client/), so the runtime stage holds no
# source tree or build tools. Only what the API imports: no worker/ and no trainer/ (the API checks specs with
# jobspec/; tests/deploy/test_dockerfiles.py imports api/ and jobs/ with both made unimportable).
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api ./api
COPY client ./client
COPY jobs ./jobs
COPY jobspec ./jobspec
COPY dashboard ./dashboard
RUN pip wheel --no-deps --wheel-dir /wheels . ./client

# ---- runtime
FROM python:${PYTHON_VERSION}-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TORCHYARD_RUNS_DIR=/var/lib/torchyard/runs \
    TORCHYARD_DATA_DIR=/var/lib/torchyard/data \
    TORCHYARD_CODE_DIR=/var/lib/torchyard/code

# A fixed numeric uid/gid: Kubernetes' runAsNonRoot can verify it, and the worker image uses the
# same ids so files in the shared runs volume belong to one owner. The directories exist in the
# image, owned by that user, because Docker seeds an empty named volume from them (ownership too).
RUN groupadd --system --gid 10001 torchyard \
    && useradd --system --uid 10001 --gid torchyard --create-home --home-dir /home/torchyard torchyard \
    && mkdir -p /var/lib/torchyard/runs /var/lib/torchyard/data /var/lib/torchyard/code \
    && chown -R torchyard:torchyard /var/lib/torchyard

# Dependencies in their own layer, before the code, so a code change does not reinstall them.
# --no-deps on the project below is what keeps torch (a dependency in pyproject.toml) out.
COPY docker/requirements.txt /tmp/requirements.txt
RUN pip install --no-cache-dir -r /tmp/requirements.txt && rm /tmp/requirements.txt

COPY --from=build /wheels /tmp/wheels
# Fail the build, not the first request, if the image is incomplete or torch slipped in.
RUN pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && python -c "import api.app, jobs.lifecycle.submission, jobspec.spec" \
    && if python -c "import torch" 2>/dev/null; then echo "torch must not be in the api image" >&2; exit 1; fi

USER 10001:10001
WORKDIR /home/torchyard
EXPOSE 8000

# /readyz answers 200 only when SQL and Redis answer, so "healthy" means "can take jobs";
# compose starts the workers after it. python, not curl: the slim image has no curl.
# Probes failed in the first two minutes do not count: on a host whose cores were all busy the API took over a
# minute to answer, compose's `up --wait` gave up on an unhealthy container, and the worker never started. A healthy
# start is marked healthy at its first passing probe all the same.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4)"]

CMD ["python", "-m", "api", "--host", "0.0.0.0", "--port", "8000"]
