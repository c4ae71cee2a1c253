"""The GPU-side process: an RQ worker whose job function supervises one torchrun launch."""
