"""What an attempt's job writes, stored in SQL as it comes: rank 0's events.jsonl (worker/tail.py), then what the job
writes without the SDK (worker/found.py), every write fenced by the attempt's lease; and the phase the trainer last
announced, which the watch and the verdict read."""

from __future__ import annotations

from pathlib import Path

from jobs.settings import Settings
from jobs.store.ingest import ingest_events
from worker.found import Found
from worker.lease import Lease
from worker.tail import BadEvent, EventTail


class Intake:
    def __init__(self, lease: Lease, settings: Settings, run_dir: Path):
        self.lease, self.batch = lease, settings.ingest_batch
        self.tail = EventTail(run_dir / "events.jsonl")
        self.found = Found(run_dir, enabled=False)  # until the spec says what to look for (worker.found.found_in_run)
        self.last_phase: str | None = None  # of the trainer's last status event

    @property
    def bad(self) -> BadEvent | None:
        """An event the service cannot store, once one was read."""
        return self.tail.bad

    def store(self, final: bool = False) -> int:
        """Store what rank 0 appended, then what the job wrote without the SDK; the tails move past it only once the
        rows are committed. ``final``: the ranks have ended. Returns the rows stored."""
        lease, batch = self.lease, self.batch
        events = self.tail.read()

        def store() -> int:
            return sum(ingest_events(lease.session, lease.job_id, events[i:i + batch], guard=lease.fence())
                       for i in range(0, len(events), batch))

        stored = lease.db(store, "storing events") if events else 0
        self.tail.ack()
        for event in events:
            if event.get("type") == "status":
                self.last_phase = event.get("phase")
        return stored + self.found.ingest(lease.session, lease.job_id, lease.fence(), lease.db, batch, final=final)
