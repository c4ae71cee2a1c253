"""Sweeps: hyperparameter searches whose trials are ordinary jobs (policy here is pure; I/O in store and controller)."""
