"""What this replica knew of the fleet, kept in its data dir: a warm restart serves at once.

A replica started cold reads every retained record before it serves (29 s for 20,000 on a
small machine). One restarted with its data dir has the devices, catalogues and names in its
SQLite registry already; what it lacks is each device's fleet record (who said what, when),
which tells the broker's news from what it knows. ``FleetCache`` keeps those records in
``data_dir/cluster-fleet``: one line per device, ``<device id> <record as on the broker>``,
after a first line naming the cluster. The file is private (0600) and written whole, to a
temporary file renamed over the old one (a crash leaves the old one), at most every
``SAVE_EVERY`` seconds while records change, and at a clean stop: never once per record.

At the next start the replica loads it and serves from it while the broker's records come in
(fleet.py ``warm``); the broker's records win once heard, exactly as for a replica that never
stopped. A file from another cluster, or unreadable, is ignored with one log line (the replica
then starts cold); each bad line is skipped alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from gateway.cluster.records import BadRecord, FleetRecord
from gateway.datadir import create_private

__all__ = ["SAVE_EVERY", "FleetCache"]

logger = logging.getLogger(__name__)

SAVE_EVERY = 5.0  # seconds between two writes while records change
_NAME = "cluster-fleet"
_VERSION = 1


class FleetCache:
    """The fleet records of one cluster (``prefix``), in ``data_dir/cluster-fleet``."""

    def __init__(self, data_dir: Path, prefix: str) -> None:
        self.path = data_dir / _NAME
        self.prefix = prefix

    def load(self) -> dict[str, FleetRecord]:
        """The records kept at the last save; none when there is no usable file."""
        try:
            with self.path.open("rb") as file:
                lines = file.read().split(b"\n")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            logger.warning("%s is unreadable (%s): this replica reads the fleet from the broker "
                           "before it serves", self.path, exc)  # fmt: skip
            return {}
        if not self._ours(lines[0]):
            logger.warning("%s is not this cluster's (%r): this replica reads the fleet from the "
                           "broker before it serves", self.path, self.prefix)  # fmt: skip
            return {}
        records: dict[str, FleetRecord] = {}
        bad = 0
        for line in lines[1:]:
            device_id, _, payload = line.partition(b" ")
            if not line:
                continue
            try:
                record = FleetRecord.read(device_id.decode(errors="replace"), payload)
            except BadRecord:
                bad += 1
                continue
            records[record.device_id] = record
        if bad:
            logger.warning("%s: %d unreadable lines skipped (those devices are read from the "
                           "broker)", self.path, bad)  # fmt: skip
        return records

    def _ours(self, header: bytes) -> bool:
        try:
            value = json.loads(header)
        except ValueError:
            return False
        return isinstance(value, dict) and value == {"cluster": self.prefix, "version": _VERSION}

    def write(self, records: Mapping[str, FleetRecord]) -> None:
        """Write ``records`` whole, in place of the last save (blocking: run it on a thread)."""
        header = json.dumps({"cluster": self.prefix, "version": _VERSION}).encode()
        lines = [header, *(f"{i} ".encode() + r.encode() for i, r in records.items())]
        temporary = create_private(self.path.with_name(_NAME + ".new"))
        with temporary.open("wb") as file:
            file.write(b"\n".join(lines) + b"\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)

    async def save(self, records: Mapping[str, FleetRecord]) -> None:
        """``write`` a snapshot of ``records`` on a worker thread; a failure is logged, and
        the next save tries again (a full disk costs a slower restart, nothing else)."""
        snapshot = dict(records)  # the fleet replaces records, never changes one in place
        try:
            await asyncio.to_thread(self.write, snapshot)
        except OSError as exc:
            logger.warning("cannot keep the fleet in %s (%s): a restart of this replica will "
                           "read the fleet from the broker before it serves", self.path,
                           exc)  # fmt: skip
