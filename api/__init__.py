"""torchyard HTTP API (FastAPI): routes, auth, request/response models."""
