"""FastAPI dependencies: settings, SQL sessions, Redis."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from redis import Redis
from sqlmodel import Session

from jobs.settings import Settings


# Async: a sync dependency costs a thread-pool hop per request for what is an attribute read.
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine, expire_on_commit=False) as session:
        yield session


async def get_redis(request: Request) -> Redis:
    return request.app.state.redis


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
RedisDep = Annotated[Redis, Depends(get_redis)]
# The {job_id} of every per-job route.
JobId = Annotated[str, Path(min_length=1, max_length=64, description="Job id.")]
