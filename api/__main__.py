"""``python -m api [--host H] [--port P]``: serve the API with uvicorn."""

from __future__ import annotations

import argparse

import uvicorn

from api.protocol import PROTOCOL
from jobs.infra import logconfig
from jobs.settings import get_settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m api", description="Serve the torchyard HTTP API.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--log-format", choices=["json", "text"], default=None, help="default TORCHYARD_LOG_FORMAT (json)")
    args = parser.parse_args(argv)
    logconfig.configure(args.log_level, args.log_format or get_settings().log_format)
    uvicorn.run(
        "api.app:create_service_app", factory=True, host=args.host, port=args.port, workers=args.workers,
        log_level=args.log_level, proxy_headers=True, http=PROTOCOL,
        # Logging is ours (JSON lines with request ids); api.middleware writes one access line per request.
        log_config=None, access_log=False,
        # uvicorn's 5 s closed a connection between two polls of a client polling every few seconds, racing the
        # next request; 65 s outlasts any poll and a load balancer's usual 60 s idle timeout in front of it.
        timeout_keep_alive=65,
    )


if __name__ == "__main__":
    main()
