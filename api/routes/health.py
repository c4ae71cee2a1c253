"""Liveness, readiness and Prometheus metrics. No auth: load balancers and scrapers call these."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from api.deps import RedisDep
from api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="The process answers")
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, summary="SQL and Redis answer", responses={503: {"model": Health}})
def readyz(request: Request, redis: RedisDep) -> JSONResponse:
    checks = {}
    try:
        with request.app.state.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        checks["database"] = "ok"
    except SQLAlchemyError as exc:
        checks["database"] = f"error: {exc.__class__.__name__}"
    try:
        redis.ping()
        checks["redis"] = "ok"
    except (RedisError, OSError) as exc:
        checks["redis"] = f"error: {exc.__class__.__name__}"
    ready = all(v == "ok" for v in checks.values())
    body = Health(status="ok" if ready else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get("/metrics", response_class=Response, summary="Prometheus metrics",
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text format."}})
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST)
