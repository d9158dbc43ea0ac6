"""The cluster's topics on the broker, and the records it keeps there, read strictly.

Under the cluster's prefix ``P`` (``[cluster] name``), docs/cluster.md:

- ``P/replica/<name>`` (retained; its last will empties it): ``{"no", "at", "since"}``, a live
  replica and its id slice, said again every heartbeat (``since``: when it last joined).
- ``P/device/<id>`` (retained; any replica, the last writer wins): the fleet's facts on a
  device, or a tombstone once it is forgotten.
- ``P/catalogue/<digest>`` (retained): the accepted tool entries, shared by identical firmware.
- ``P/presence/<id>`` (retained; the replica a WebSocket device reached, cleared when it
  leaves): ``{"replica", "session", "at"}``.
- ``P/bridge/<id>/down`` and ``/up``: frames for a bridged WebSocket device, and its replies
  to other replicas' calls.
- ``P/boards/<name>`` (retained; said again at each join): ``{"boards", "at"}``, the ids of
  the boards that serve MCP themselves which the replica reaches (cluster/boards.py).
- ``P/sync/<name>``: the replica's barrier; every retained record came before it.
- ``P/probe/<name>``: retained for a moment at each join, read back through the wildcard
  ``P/probe/+``: a broker that does not send retained messages to wildcards is refused.

A record is JSON; one that does not read as its kind is refused alone (``BadRecord``), with a
log line by the caller. Device logins cannot write any of these (the broker's ACL,
docs/cluster.md): records come from replicas, but are checked all the same.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from dataclasses import dataclass
from typing import Any

from gateway.device_side.broker import is_device_id
from gateway.devices.catalogue import digest_of
from gateway.devices.device import APPROVED, PENDING, REJECTED
from gateway.devices.store import DeviceRecord
from gateway.devices.tokens import same_identity, seal

__all__ = [
    "BadRecord",
    "BoardOffer",
    "ClusterTopics",
    "FleetRecord",
    "Presence",
    "ReplicaRecord",
    "key_name",
    "read_catalogue",
    "sealed",
    "unsealed",
]

JsonObject = dict[str, Any]
_STATES = (APPROVED, PENDING, REJECTED)
_MAX_TEXT = 256  # characters of any string field (an alias is 32, a binding a MAC or so)
_KEYED = ("replica", "device", "catalogue", "presence", "boards", "sync")  # P/<kind>/<key>
MAX_OFFERED = 4096  # boards one replica reaches: its config, data dir (1,000) and mDNS (256)


class BadRecord(ValueError):
    """A record on the broker that does not read as its kind; it is ignored."""


@dataclass(frozen=True, slots=True)
class ClusterTopics:
    """The cluster's topic names under one prefix."""

    prefix: str

    def replica(self, name: str) -> str:
        return f"{self.prefix}/replica/{name}"

    def device(self, device_id: str) -> str:
        return f"{self.prefix}/device/{device_id}"

    def catalogue(self, digest: str) -> str:
        return f"{self.prefix}/catalogue/{digest}"

    def presence(self, device_id: str) -> str:
        return f"{self.prefix}/presence/{device_id}"

    def boards(self, name: str) -> str:
        return f"{self.prefix}/boards/{name}"

    def bridge(self, device_id: str, direction: str) -> str:
        return f"{self.prefix}/bridge/{device_id}/{direction}"

    def sync(self, name: str) -> str:
        return f"{self.prefix}/sync/{name}"

    def probe(self, name: str) -> str:
        """The replica's retained probe at join: does the broker send it to a wildcard?"""
        return f"{self.prefix}/probe/{name}"

    def retained(self) -> list[str]:
        """The topics of the retained records (what a replica must know of the fleet)."""
        p = self.prefix
        return [f"{p}/replica/+", f"{p}/device/+", f"{p}/catalogue/+", f"{p}/presence/+",
                f"{p}/boards/+"]  # fmt: skip

    def subscriptions(self, name: str) -> list[str]:
        """What every replica subscribes to (with mosquitto, every bridge ``up`` reaches all)."""
        p = self.prefix
        return [*self.retained(), f"{p}/bridge/+/up", f"{p}/bridge/+/down", self.sync(name)]

    def parse(self, topic: str) -> tuple[str, str, str] | None:
        """``(kind, key, direction)`` of a cluster topic; None for anything else."""
        parts = topic.split("/")
        if parts[:-2] == self.prefix.split("/") or parts[:-3] == self.prefix.split("/"):
            rest = parts[len(self.prefix.split("/")) :]
            if len(rest) == 2 and rest[0] in _KEYED:
                return rest[0], rest[1], ""
            if len(rest) == 3 and rest[0] == "bridge" and rest[2] in ("up", "down"):
                return "bridge", rest[1], rest[2]
        return None


def _object(payload: bytes) -> JsonObject:
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):
        raise BadRecord("not JSON") from None
    if not isinstance(value, dict):
        raise BadRecord("not a JSON object")
    return value


def _text(value: JsonObject, key: str, *, optional: bool = True) -> str | None:
    text = value.get(key)
    if text is None and optional:
        return None
    if not isinstance(text, str) or not text or len(text) > _MAX_TEXT:
        raise BadRecord(f"{key} is not a short string")
    return text


def _time(value: JsonObject) -> float:
    at = value.get("at")
    if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
        raise BadRecord("at is not a time")
    return float(at)


@dataclass(frozen=True, slots=True)
class ReplicaRecord:
    """A live replica: its number (the top bits of its request ids), when it said so, and when
    it last joined the broker (a new ``since``: what was sent to it before may be lost)."""

    no: int
    at: float
    since: float = 0.0
    key: str | None = None  # names the key that seals its bindings (``key_name``)

    @classmethod
    def read(cls, payload: bytes) -> ReplicaRecord:
        value = _object(payload)
        no = value.get("no")
        if isinstance(no, bool) or not isinstance(no, int) or not 1 <= no <= 127:
            raise BadRecord("no is not a replica number in 1..127")
        since = value.get("since", 0.0)
        if (
            isinstance(since, bool)
            or not isinstance(since, int | float)
            or not math.isfinite(since)
        ):
            raise BadRecord("since is not a time")
        return cls(no, _time(value), float(since), _text(value, "key"))

    def encode(self) -> bytes:
        value: dict[str, object] = {"no": self.no, "at": self.at, "since": self.since}
        if self.key is not None:
            value["key"] = self.key
        return json.dumps(value).encode()


def key_name(key: bytes | None) -> str | None:
    """What names the key that seals bindings, and tells nothing of it: replicas compare it."""
    return hmac.new(key, b"key name", hashlib.sha256).hexdigest()[:16] if key else None


@dataclass(frozen=True, slots=True)
class FleetRecord:
    """The fleet's facts on one device: the user's decisions and its catalogue's digest.

    ``forgotten`` makes it a tombstone (the device was forgotten at ``at``). Last writer wins:
    a record older than what a replica knows is ignored.
    """

    device_id: str
    at: float
    by: str
    forgotten: bool = False
    alias: str = ""
    state: str = PENDING
    board: str | None = None
    binding: str | None = None  # sealed (tokens.seal): never a Client-Id in clear
    transport: str | None = None
    catalogue: str | None = None
    server_info: JsonObject | None = None
    seen: str | None = None  # an unbound device: the Client-Id it checked in with, sealed

    @property
    def facts(self) -> tuple[object, ...]:
        """What replicas must agree on (``at`` and ``by`` say only who said it when)."""
        return (self.forgotten, self.alias, self.state, self.board, self.binding,
                self.transport, self.catalogue, self.seen)  # fmt: skip

    @classmethod
    def read(cls, device_id: str, payload: bytes) -> FleetRecord:
        if not is_device_id(device_id):
            raise BadRecord("the topic does not name a device id")
        value = _object(payload)
        at, by = _time(value), _text(value, "by", optional=False)
        assert by is not None
        if value.get("forgotten") is True:
            return cls(device_id, at, by, forgotten=True)
        state = value.get("state")
        if state not in _STATES:
            raise BadRecord(f"state is not one of {', '.join(_STATES)}")
        alias = _text(value, "alias", optional=False)
        assert alias is not None
        info = value.get("server_info")
        if info is not None and not isinstance(info, dict):
            raise BadRecord("server_info is not an object")
        return cls(device_id, at, by, alias=alias, state=state, board=_text(value, "board"),
                   binding=_text(value, "binding"), transport=_text(value, "transport"),
                   catalogue=_text(value, "catalogue"), server_info=info,
                   seen=_text(value, "seen"))  # fmt: skip

    def encode(self) -> bytes:
        if self.forgotten:
            return json.dumps({"forgotten": True, "at": self.at, "by": self.by}).encode()
        fields = {"alias": self.alias, "state": self.state, "board": self.board,
                  "binding": self.binding, "transport": self.transport,
                  "catalogue": self.catalogue, "server_info": self.server_info,
                  "at": self.at, "by": self.by}  # fmt: skip
        if self.seen is not None:
            fields["seen"] = self.seen
        return json.dumps(fields, ensure_ascii=False).encode()


@dataclass(frozen=True, slots=True)
class Presence:
    """A WebSocket device connected to ``replica``, in session ``session``; or an MQTT device
    whose session ``replica`` owns (``mqtt``: the others call it on its own topics)."""

    replica: str
    session: str
    at: float
    mqtt: bool = False

    @classmethod
    def read(cls, payload: bytes) -> Presence:
        value = _object(payload)
        replica, session = _text(value, "replica", optional=False), _text(value, "session")
        assert replica is not None
        return cls(replica, session or "", _time(value), value.get("transport") == "mqtt")

    def encode(self) -> bytes:
        value: dict[str, object] = {"replica": self.replica, "session": self.session,
                                    "at": self.at}  # fmt: skip
        if self.mqtt:
            value["transport"] = "mqtt"
        return json.dumps(value).encode()


@dataclass(frozen=True, slots=True)
class BoardOffer:
    """The boards that serve MCP themselves which a replica reaches (their device ids)."""

    boards: frozenset[str]
    at: float

    @classmethod
    def read(cls, payload: bytes) -> BoardOffer:
        value = _object(payload)
        boards = value.get("boards")
        if not isinstance(boards, list) or len(boards) > MAX_OFFERED:
            raise BadRecord(f"boards is not a list of at most {MAX_OFFERED} device ids")
        if not all(isinstance(b, str) and is_device_id(b) for b in boards):
            raise BadRecord("boards holds something that is not a device id")
        return cls(frozenset(boards), _time(value))

    def encode(self) -> bytes:
        return json.dumps({"boards": sorted(self.boards), "at": self.at}).encode()


def read_catalogue(digest: str, payload: bytes) -> list[object]:
    """The tool entries of a catalogue record, which must hash to the digest that names it.

    Each entry is judged again by the registry that takes it (a bad tool is dropped alone).
    """
    try:
        entries = json.loads(payload)
    except (ValueError, RecursionError):
        raise BadRecord("not JSON") from None
    if not isinstance(entries, list):
        raise BadRecord("not a list of tools")
    if digest_of(entries) != digest:
        raise BadRecord("its tools do not hash to the digest that names it")
    return entries


def sealed(key: bytes | None, identity: str | None) -> str | None:
    """An identity as the fleet's records carry it: sealed (``tokens.seal``), never in clear,
    not even without a key (the cluster always sets one)."""
    return seal(key, identity) if identity is not None and key is not None else None


def unsealed(key: bytes | None, value: str | None, local: DeviceRecord | None) -> str | None:
    """The identity this replica knows in clear for the sealed ``value``, else ``value``."""
    if value is None or local is None:
        return value
    for clear in (local.binding, local.client_id):
        if same_identity(value, clear, key):
            return clear
    return value
