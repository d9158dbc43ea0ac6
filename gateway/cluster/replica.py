"""Who this replica is: a name stable across restarts, and a number that tags its request ids.

The name is ``[cluster] replica``, else one made at the first start and kept in
``data_dir/replica`` (so a restart with the same data dir is the same replica, and takes its
own stale presence records back). The number, 1..127, is the top byte of every request id the
replica sends a device (``no << 24 | n``, ``n`` below 2**24): a positive int32, which stock
firmware reads with cJSON ``valueint``, and which names the replica a reply belongs to.
Numbers are claimed on the broker at each start: the one the name hashes to, else the next one
no live replica holds; of two replicas that claimed one number at once, the one whose name
sorts later moves.

The name also says where the replica goes first among the broker nodes (``home_node``): the
list is rotated per replica, so that replicas spread over the nodes and one node's death cuts
only the replicas on it.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import socket
from collections.abc import Iterable

from gateway.config import Config
from gateway.datadir import create_private
from gateway.errors import GatewayError

__all__ = [
    "MAX_REPLICAS",
    "Ownership",
    "home_node",
    "id_slice",
    "owner_of",
    "pick_number",
    "replica_name",
    "slice_of",
]

MAX_REPLICAS = 127
_SLICE_BITS = 24
_FILE = "replica"


def replica_name(config: Config) -> str:
    """This replica's name: configured, or kept in the data dir (made at the first start)."""
    if config.cluster_replica:
        return config.cluster_replica
    path = config.data_dir / _FILE
    name = path.read_text().strip() if path.exists() else ""
    if not name:
        host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:40] or "gw"
        name = f"{host}-{secrets.token_hex(3)}"
        create_private(path).write_text(name + "\n")
    return name


def home_node(name: str, nodes: int) -> int:
    """Where in the broker list (``nodes`` long) the replica ``name`` starts: its number where
    the name ends in one (gw1, gw2, gw3 and pod-0, pod-1, pod-2 each take another node), else
    where the name hashes to."""
    number = re.search(r"(\d+)$", name)
    if number is not None:
        return int(number[1]) % nodes
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % nodes


def pick_number(name: str, taken: Iterable[int]) -> int:
    """The number ``name`` hashes to, else the next free one.

    Raises:
        GatewayError: every number is taken (more than 127 replicas).
    """
    used = set(taken)
    first = int(hashlib.sha256(name.encode()).hexdigest(), 16) % MAX_REPLICAS
    for step in range(MAX_REPLICAS):
        candidate = (first + step) % MAX_REPLICAS + 1
        if candidate not in used:
            return candidate
    raise GatewayError(f"a cluster has at most {MAX_REPLICAS} replicas; all numbers are taken")


def owner_of(device_id: str, replicas: Iterable[str]) -> str:
    """The replica that owns an MQTT device's session: rendezvous (highest random weight)
    hashing, so every replica that knows the same live set picks the same one with no shared
    history, and a replica coming or going moves only the devices it wins or held."""
    return max(replicas, key=lambda name: _weight(name, device_id))


def _weight(name: str, device_id: str) -> bytes:
    return hashlib.sha256(f"{name}/{device_id}".encode()).digest()


class Ownership:
    """``owner_of``, kept per device for the live set: asked again, nothing is hashed. A replica
    joining costs one hash per device (does it win?); one leaving, the devices it owned, weighed
    again against the others when next asked."""

    def __init__(self) -> None:
        self._live: frozenset[str] = frozenset()
        self._best: dict[str, tuple[bytes, str]] = {}  # device id -> its winning weight, owner

    def owner(self, device_id: str, live: frozenset[str]) -> str:
        """The owner of ``device_id`` among ``live`` (not empty)."""
        if live != self._live:
            self._move(live)
        best = self._best.get(device_id)
        if best is None:
            best = self._best[device_id] = max((_weight(n, device_id), n) for n in live)
        return best[1]

    def _move(self, live: frozenset[str]) -> None:
        gone, new = self._live - live, live - self._live
        self._live = live
        for device_id, best in list(self._best.items()):
            if best[1] in gone:
                del self._best[device_id]  # weighed again when asked
                continue
            for name in new:
                best = max(best, (_weight(name, device_id), name))
            self._best[device_id] = best


def id_slice(no: int) -> range:
    """The request ids replica ``no`` sends: ``no << 24 | 1`` .. ``no << 24 | 0xFFFFFF``."""
    return range((no << _SLICE_BITS) | 1, (no + 1) << _SLICE_BITS)


def split_slice(ids: range) -> tuple[range, range]:
    """A replica's slice in two: the ids of its sessions with devices, and those of its calls
    to devices other replicas run. Apart, since an MQTT device's replies reach both: a session
    this replica opens as the device is handed to it must not take the reply to a call it made
    directly before, nor that call the reply to the session's ``initialize``."""
    middle = ids.start + len(ids) // 2
    return range(ids.start, middle), range(middle, ids.stop)


def slice_of(request_id: int) -> int:
    """The replica number a request id carries."""
    return request_id >> _SLICE_BITS
