"""The job domain shared by api/ and worker/: tables, state machine, queueing, settings."""
