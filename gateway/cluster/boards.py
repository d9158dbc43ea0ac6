"""Which replica holds each board that serves MCP itself: one, among those that reach it.

A board (gateway/device_side/boards) serves one MCP session to each client that connects, and
every replica with the board in its config, its data dir or its mDNS view could connect: held
by each, the board would carry one session per replica and every call's load N times over. So
each replica says which boards it reaches (a retained ``P/boards/<replica>`` with their ids,
said again at each join) and a board's holder is the live replica, among those that reach it,
that wins rendezvous hashing of its id (``replica.owner_of``, the rule of MQTT devices): every
replica that knows the same records picks the same one, with nothing to agree on. The others
call the board through the holder's bridge, as a WebSocket device (docs/cluster.md).
"""

from __future__ import annotations

from collections.abc import Collection

from gateway.cluster.records import BoardOffer
from gateway.cluster.replica import owner_of

__all__ = ["BoardOwners"]


class BoardOwners:
    """The boards each replica reaches; who holds each one among the live replicas."""

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self.mine: frozenset[str] = frozenset()  # the boards this replica reaches
        self._offers: dict[str, frozenset[str]] = {}  # the other replicas' (a past life's too)

    def hear(self, name: str, offer: BoardOffer | None) -> bool:
        """Take replica ``name``'s offer (None: it offers none); did it change?"""
        if name == self.replica:  # a past life's record: what this replica offers is ``mine``
            return False
        boards = offer.boards if offer is not None else frozenset()
        if self._offers.get(name, frozenset()) == boards:
            return False
        if boards:
            self._offers[name] = boards
        else:
            self._offers.pop(name, None)
        return True

    def holder(self, board_id: str, live: Collection[str]) -> str | None:
        """The replica among ``live`` that holds ``board_id``; None if none reaches it."""
        reach = [n for n in live if board_id in self.offered_by(n)]
        return owner_of(board_id, reach) if reach else None

    def offered_by(self, name: str) -> frozenset[str]:
        """The boards replica ``name`` reaches, as far as this replica knows."""
        return self.mine if name == self.replica else self._offers.get(name, frozenset())
