"""The whole service on one machine: API, worker(s) and a private redis-server unless TORCHYARD_REDIS_URL is set."""
