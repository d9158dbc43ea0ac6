"""Which replicas live: their latest ``P/replica/<name>`` records and when each was heard.

A replica's record comes again every ``HEARTBEAT`` seconds while it lives. One that falls
silent is cut off, or died with the broker node that held its last will: calls through it fail
after ``CALLS_SILENT_AFTER`` seconds, and after ``SILENT_AFTER`` it counts as gone.
"""

from __future__ import annotations

import time

from gateway.cluster.records import ReplicaRecord

__all__ = ["CALLS_SILENT_AFTER", "HEARTBEAT", "SILENT_AFTER", "LiveReplicas"]

HEARTBEAT = 2.0  # seconds between a replica's records
SILENT_AFTER = 15 * HEARTBEAT
# Calls through a replica silent for 3 heartbeats fail (its will may have died with its broker
# node): bound to CALLS_SILENT_AFTER + HEARTBEAT seconds, not the 30 s of SILENT_AFTER.
CALLS_SILENT_AFTER = 3 * HEARTBEAT


class LiveReplicas:
    """The other replicas this one has heard from (and itself, once its record comes back)."""

    def __init__(self, own: str) -> None:
        self.records: dict[str, ReplicaRecord] = {}
        self.heard_at: dict[str, float] = {}  # replica -> monotonic time of its last record
        self._own = own

    def hear(self, name: str, record: ReplicaRecord) -> ReplicaRecord | None:
        """Note the replica's record, heard now; the one it replaces, None for a new replica."""
        known = self.records.get(name)
        self.records[name] = record
        self.heard_at[name] = time.monotonic()
        return known

    def drop(self, name: str) -> None:
        """The replica is gone."""
        self.records.pop(name, None)
        self.heard_at.pop(name, None)

    def clear(self) -> None:
        """Nothing is known of the others any more (this replica lost the broker)."""
        self.records.clear()
        self.heard_at.clear()

    def silent(self, seconds: float) -> list[str]:
        """The other replicas not heard from for longer than ``seconds``."""
        limit = time.monotonic() - seconds
        return [n for n, t in self.heard_at.items() if t < limit and n != self._own]
