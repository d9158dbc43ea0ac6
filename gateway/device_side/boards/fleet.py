"""``Boards``: every board the gateway is the MCP client of, and where each came from.

- ``[[mcp_devices]]`` in the config, and boards the owner adds at run time (CLI ``devices add``,
  the dashboard, ``POST /api/devices/add``): approved as they are added. Those added at run
  time are kept in ``boards.json`` in the data dir (mode 0600: it holds their tokens). A file
  that cannot be read is kept as it is and no add is saved over it (``datadir.KeptJson``); an
  entry that is not a usable board is kept in the file as it was.
- boards found over mDNS (``[mcp_boards] discover``, ``discovery.py``): pending until the owner
  approves them, like a stock device that checks in through OTA, but never in the stock
  devices' places: at most ``[mcp_boards] discover_max_pending`` wait at once, and never one at
  an address of this machine or outside ``networks``. One that stops announcing itself is let
  go after ``[mcp_boards] discover_grace`` seconds: offline, its tools kept once approved,
  forgotten while it still waits (a flood that comes and goes leaves nothing behind).

In a cluster every replica tells which boards it reaches (``offered``) and connects only to those
it holds (``owns``, gateway/cluster/boards.py); ``reown()`` applies that again when it may have
changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from typing import Any

from gateway.config import Config
from gateway.config.boards import BoardOptions, board_url
from gateway.datadir import KeptJson
from gateway.device_side.boards.board import Board, Serve, board_id
from gateway.device_side.boards.discovery import Discovery
from gateway.devices.device import PENDING
from gateway.devices.registry import DeviceRegistry
from gateway.errors import ConfigError, GatewayError
from gateway.net.networks import Network, interface_networks, networks

__all__ = ["Boards"]

logger = logging.getLogger(__name__)

MAX_ADDED = 1000  # boards added at run time; past it an add is refused (a runaway script)


class Boards:
    """Runs one ``Board`` per board URL; ``async with`` stops them all."""

    def __init__(
        self,
        config: Config,
        registry: DeviceRegistry,
        serve: Serve,
        *,
        owns: Callable[[str], bool] | None = None,
        offered: Callable[[frozenset[str]], None] | None = None,
    ) -> None:
        self._config = config
        self._registry = registry
        self._serve = serve
        self._file = KeptJson(config.data_dir / "boards.json", list, "the boards added at run time")
        self._boards: dict[str, Board] = {}
        self._added: list[BoardOptions] = []
        self._unusable: list[object] = []  # entries of the file that are no board: kept as they are
        self._forgetting: dict[str, asyncio.TimerHandle] = {}
        self.own_ports: Collection[int] = ()  # the gateway's listening ports, once known
        self.networks: tuple[Network, ...] = ()  # where discovered boards may be, once browsing
        self._discovery: Discovery | None = None
        # cluster: does this replica hold the board; these are the boards it reaches (None: a
        # single gateway holds every board, and tells no one)
        self.owns = owns if owns is not None else lambda device_id: True
        self.offered = offered if offered is not None else lambda device_ids: None

    async def __aenter__(self) -> Boards:
        return self

    def start(self, own_ports: Collection[int]) -> None:
        """Connect to every board added so far, now that the gateway's own ports are known."""
        self.own_ports = tuple(own_ports)
        self._added, self._unusable = _load(self._file)
        for options in (*self._config.mcp_devices, *self._added):
            if board_id(options.url) not in self._boards:
                self._start(options, trusted=True)
        self.offered(frozenset(self._boards))

    async def discover(self) -> None:
        """Browse mDNS for boards (``[mcp_boards] discover``), once the ports are known."""
        interfaces = self._config.boards_discover_interfaces
        self.networks = networks(self._config.boards_discover_networks) or (
            await asyncio.to_thread(interface_networks, interfaces)
        )
        if not self.networks:
            logger.warning("mDNS: the interfaces browsed on are on no network but loopback and "
                           "link-local: no board can be discovered; set [mcp_boards] "
                           "discover_networks")  # fmt: skip
        self._discovery = Discovery(self.discovered, self.vanished, list(interfaces) or None,
                                    self.networks)  # fmt: skip
        await self._discovery.start()

    @property
    def discovery(self) -> Discovery | None:
        """The mDNS browsing, once started."""
        return self._discovery

    async def __aexit__(self, *exc: object) -> None:
        if self._discovery is not None:
            await self._discovery.stop()
        for timer in self._forgetting.values():
            timer.cancel()
        self.offered(frozenset())  # cluster: the others take its boards now, not when it has left
        await asyncio.gather(*(board.stop() for board in self._boards.values()))

    def reown(self) -> None:
        """cluster: which boards this replica holds may have changed."""
        for board in self._boards.values():
            board.reown()

    def get(self, device_id: str) -> Board | None:
        """The board that is device ``device_id``, if any."""
        return self._boards.get(device_id)

    def add(self, url: str, name: str | None = None, token: str | None = None) -> dict[str, Any]:
        """Add a board by URL, approved, kept across restarts; return its id and alias.

        Raises:
            GatewayError: the URL is not a board's, or too many boards were added.
            StorageUnavailable: ``boards.json`` is unreadable: the board was not added.
            OSError: ``boards.json`` cannot be written: the board was not added.
        """
        try:
            url = board_url("url", url)
        except ConfigError as exc:
            raise GatewayError(str(exc)) from None
        options = BoardOptions(url, (name or "").strip() or None, (token or "").strip() or None)
        board = self._boards.get(board_id(url))
        if board is None or not board.trusted:
            if len(self._added) >= MAX_ADDED:
                raise GatewayError(f"{MAX_ADDED} boards were added already")
            added = [b for b in self._added if b.url != url] + [options]
            self._save(added)
            self._added = added
        if board is not None and not board.trusted:  # it was discovered: the owner approves it
            board.trusted = True
            device = self._registry.get(board.device_id)
            if device is not None:
                self._registry.admin.approve(device)
        elif board is None:
            board = self._start(options, trusted=True)
            self.offered(frozenset(self._boards))
        device = self._registry.get(board.device_id)
        return {"id": board.device_id, "device": device.alias if device else board.device_id,
                "url": url}  # fmt: skip

    def forget(self, device_id: str) -> None:
        """Stop connecting to the board ``device_id`` (the owner forgot it); no-op for others."""
        board = self._boards.pop(device_id, None)
        if board is None:
            return
        if any(board_id(b.url) == device_id for b in self._config.mcp_devices):
            logger.warning("board %s is in the config ([[mcp_devices]]): it comes back at the "
                           "next start unless you take it out", board.url)  # fmt: skip
        if any(b.url == board.url for b in self._added):
            self._added = [b for b in self._added if b.url != board.url]
            self._save(self._added)
        self.offered(frozenset(self._boards))
        asyncio.get_running_loop().create_task(
            board.stop(), name=f"gateway.board.stop[{device_id}]"
        )

    def discovered(self, url: str) -> str | None:
        """A board announced itself at ``url`` (mDNS): connect to it, pending approval; None,
        or why not (as many discovered boards wait already)."""
        device_id = board_id(url)
        timer = self._forgetting.pop(device_id, None)
        if timer is not None:
            timer.cancel()
        if device_id in self._boards:
            return None
        most = self._config.boards_discover_max_pending
        if len(self._waiting_discovered()) >= most:
            return (f"{most} discovered boards wait for approval already ([mcp_boards] "
                    "discover_max_pending): approve, reject or forget some")  # fmt: skip
        logger.info("board found over mDNS: %s", url)
        self._start(BoardOptions(url), trusted=False)
        self.offered(frozenset(self._boards))
        return None

    def _waiting_discovered(self) -> set[str]:
        """The discovered boards waiting for approval: held here (admitted or about to be),
        or pending from before (a previous run, another replica)."""
        held = set()
        for board in self._boards.values():
            device = self._registry.get(board.device_id)
            if not board.trusted and (device is None or device.record.state == PENDING):
                held.add(board.device_id)
        return held | self._registry.waiting_boards.keys()

    def vanished(self, url: str) -> None:
        """A discovered board stopped announcing itself: let it go after the grace period."""
        device_id = board_id(url)
        board = self._boards.get(device_id)
        if board is None or board.trusted or device_id in self._forgetting:
            return
        loop = asyncio.get_running_loop()
        self._forgetting[device_id] = loop.call_later(
            self._config.boards_discover_grace, self._let_go, device_id
        )

    def _let_go(self, device_id: str) -> None:
        self._forgetting.pop(device_id, None)
        board = self._boards.get(device_id)
        if board is not None and not board.trusted:
            del self._boards[device_id]
            self.offered(frozenset(self._boards))
            device = self._registry.get(device_id)
            if device is not None and device.record.state == PENDING:
                self._registry.admin.forget(
                    device
                )  # nothing to approve any more: its place is free
                logger.info("board %s no longer announces itself: forgotten (it was waiting "
                            "for approval)", board.url)  # fmt: skip
            else:
                logger.info("board %s no longer announces itself: disconnected", board.url)
            asyncio.create_task(board.stop(), name=f"gateway.board.stop[{device_id}]")

    def _save(self, added: list[BoardOptions]) -> None:
        entries = [{"url": b.url, "name": b.name, "token": b.token} for b in added]
        self._file.save([*self._unusable, *entries])

    def _start(self, options: BoardOptions, *, trusted: bool) -> Board:
        board = Board(options.url, options.token, trusted=trusted, config=self._config,
                      registry=self._registry, serve=self._serve,
                      own_ports=lambda: self.own_ports,
                      networks=lambda: self.networks, owns=self.owns)  # fmt: skip
        if options.name:
            self._registry.admin.adopt(board.device_id, options.name)
        self._boards[board.device_id] = board
        board.start()
        return board


def _load(file: KeptJson) -> tuple[list[BoardOptions], list[object]]:
    """The boards ``file`` keeps, and its entries that are no usable board (logged)."""
    boards: list[BoardOptions] = []
    unusable: list[object] = []
    for entry in file.load():
        try:
            url = board_url("url", entry.get("url"))
        except (ConfigError, AttributeError) as exc:
            logger.warning("%s: an entry is not a board (%s); kept in the file, not connected",
                           file.path, exc)  # fmt: skip
            unusable.append(entry)
            continue
        boards.append(BoardOptions(url, entry.get("name"), entry.get("token")))
    return boards, unusable
