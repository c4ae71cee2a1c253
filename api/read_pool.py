"""A small thread pool for the hot read routes (GET /v1/jobs/{id}).

Their work is short and holds the GIL most of the time, so the default 40-thread pool only adds switching:
with 32 requests in flight, 32 threads took turns on one interpreter and each request's latency grew with
all of them. A few threads keep the database waits overlapped and the rest of the requests queue in order.
The ``read_threads`` setting (``TORCHYARD_READ_THREADS``, default 4) sizes it."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from jobs.settings import get_settings

P = ParamSpec("P")
T = TypeVar("T")


@functools.cache
def _pool() -> ThreadPoolExecutor:
    # One per process, sized on first use: the settings are read once, as the API's own are.
    return ThreadPoolExecutor(max_workers=get_settings().read_threads, thread_name_prefix="read")


async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await asyncio.get_running_loop().run_in_executor(_pool(), functools.partial(fn, *args, **kwargs))
