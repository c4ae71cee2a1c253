"""``python -m api [--host H] [--port P]``: serve the API with uvicorn."""

from __future__ import annotations

import argparse
import logging

import uvicorn


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m api", description="Serve the torchyard HTTP API.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(
        "api.app:create_app", factory=True, host=args.host, port=args.port, workers=args.workers,
        log_level=args.log_level, proxy_headers=True,
    )


if __name__ == "__main__":
    main()
