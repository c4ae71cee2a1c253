"""The whole service on one machine: API, worker(s) and, when none answers, a private redis-server."""
