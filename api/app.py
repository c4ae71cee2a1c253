"""The FastAPI application."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

import dashboard
from api import errors, methods
from api.auth import Principal
from api.job_reader import JobReader
from api.key_cache import KeyCache
from api.middleware import BodySizeLimit, RequestContext
from api.observability import make_registry
from api.routes import artifacts, code, health, hosts, jobs, keys, quotas, streams, sweeps, usage, webhooks
from api.stream_slots import StreamSlots
from jobs.infra import logconfig
from jobs.infra.queue import redis_client
from jobs.lifecycle.reconciler import ReconcilerLoop
from jobs.settings import Settings, get_settings
from jobs.store.db import get_engine, init_db
from jobs.webhooks.sender import WebhookSender
from jobspec.pdeathsig import set_not_dumpable
from torchyard.version import VERSION

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    if not logging.getLogger().handlers:
        # A process uvicorn spawned (--workers > 1) has not run api.__main__'s logging setup.
        logconfig.configure(fmt=settings.log_format)
    if not settings.admin_token:
        raise RuntimeError("TORCHYARD_ADMIN_TOKEN is not set: the API refuses to start without an admin key")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Alembic migrations to head; several API replicas and workers may start at once (jobs.store.db.migrate locks).
        init_db(app.state.engine)
        # The API recovers lost jobs too, so they are found even while every worker is busy or gone.
        reconciler = ReconcilerLoop(settings, interval_s=max(1.0, settings.lease_ttl_s / 2))
        reconciler.start()
        # Webhooks are sent from the API: it is up whenever jobs can change (workers may all be gone, or sit on
        # hosts without a way out), and it holds the secrets key the signing secrets are stored under.
        sender = WebhookSender(settings)
        sender.start()
        yield
        sender.stop()
        reconciler.stopped.set()
        reconciler.join(10)  # the pass in progress, before the process closes what it uses
        await app.state.job_reader.close()

    app = FastAPI(
        title="torchyard",
        version=VERSION,
        description="Run PyTorch distributed training jobs (DDP / FSDP2 under torchrun) over HTTP.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = get_engine(settings.database_url)
    app.state.redis = redis_client(settings.redis_url)
    app.state.job_reader = JobReader(settings.database_url, app.state.engine, pool_size=settings.read_threads)
    app.state.stream_slots = StreamSlots(settings.max_streams_per_owner)
    app.state.key_cache = KeyCache[Principal](settings.key_cache_s)
    registry, latency = make_registry(app.state.engine, app.state.redis)
    app.state.metrics_registry = registry
    errors.install(app)
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(streams.router)
    app.include_router(artifacts.router)
    app.include_router(keys.router)
    app.include_router(hosts.router)
    app.include_router(quotas.router)
    app.include_router(sweeps.router)
    app.include_router(usage.router)
    app.include_router(webhooks.router)
    code.install(app)
    dashboard.mount(app)
    methods.install(app)  # last: OPTIONS answered from every route above
    # Outermost last: the size limit sees the raw body before anything reads it.
    app.add_middleware(RequestContext, latency=latency)
    # Code bundles have a cap of their own (the route enforces it on the inflated archive; 1 MiB slack for gzip framing).
    app.add_middleware(BodySizeLimit, limit=settings.max_request_bytes, overrides={
        "/v1/code": (settings.max_code_bytes + (1 << 20), "TORCHYARD_MAX_CODE_BYTES")})
    return app


def create_service_app() -> FastAPI:
    """The app as ``python -m api`` serves it (uvicorn's factory, in every worker process it starts): the
    process holds the database URL, the admin token and the secrets key, so it is closed to same-user
    processes such as jobs first. Tests build apps in-process with ``create_app`` and keep theirs open."""
    set_not_dumpable()
    return create_app()
