"""HTTP load generator, run as its own process so it does not share an interpreter with the API.

    python -m bench.loadgen --url http://127.0.0.1:8000 --token T --mode get --ids-file ids.txt \\
        --concurrency 50 --duration 10 --warmup 2

``--concurrency`` clients (coroutines, each with its own keep-alive connection) send requests back
to back: ``get`` asks for ``GET /v1/jobs/{id}`` of a random id from the file, ``post`` submits
``--body``. Requests that finish during the warm-up are not counted. Prints one JSON object:
requests per second, latency percentiles in milliseconds and the count of each status code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

from bench.common import pct


async def _client(client: httpx.AsyncClient, args: argparse.Namespace, ids: list[str], body: dict, start: float, end: float,
                  lat: list[float], codes: Counter) -> None:
    rng = random.Random()
    while True:
        t0 = time.perf_counter()
        if t0 >= end:
            return
        try:
            if args.mode == "get":
                resp = await client.get(f"/v1/jobs/{rng.choice(ids)}")
            else:
                resp = await client.post("/v1/jobs", json=body)
            code = resp.status_code
        except httpx.HTTPError as exc:
            code = type(exc).__name__
        t1 = time.perf_counter()
        if start <= t0 and t1 <= end:
            lat.append((t1 - t0) * 1e3)
            codes[str(code)] += 1


async def run(args: argparse.Namespace) -> dict:
    ids = Path(args.ids_file).read_text().split() if args.ids_file else []
    body = json.loads(args.body) if args.body else {}
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    lat: list[float] = []
    codes: Counter = Counter()
    async with httpx.AsyncClient(base_url=args.url, headers={"Authorization": f"Bearer {args.token}"}, limits=limits,
                                 timeout=60) as client:
        now = time.perf_counter()
        start, end = now + args.warmup, now + args.warmup + args.duration
        await asyncio.gather(*(_client(client, args, ids, body, start, end, lat, codes) for _ in range(args.concurrency)))
    ok = sum(n for c, n in codes.items() if c.startswith("2"))
    return {"mode": args.mode, "concurrency": args.concurrency, "duration_s": args.duration, "requests": len(lat), "ok": ok,
            "rps": ok / args.duration, "p50_ms": pct(lat, 50), "p90_ms": pct(lat, 90), "p99_ms": pct(lat, 99),
            "codes": dict(codes)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True)
    ap.add_argument("--mode", choices=["get", "post"], required=True)
    ap.add_argument("--ids-file")
    ap.add_argument("--body")
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    sys.stdout.write(json.dumps(asyncio.run(run(args))) + "\n")


if __name__ == "__main__":
    main()
