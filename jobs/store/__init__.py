"""What is stored, and the only ways it changes: the SQL tables (``models``) and their Alembic migrations
(``migrations``), engines and sessions (``db``), the job state machine whose guarded transitions every status
change goes through (``states``), the per-owner counters those transitions move (``limits``), and a run's events and
found files written into SQL idempotently (``ingest``, ``ingest_found``)."""
