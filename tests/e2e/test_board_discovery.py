"""Boards found over mDNS (loopback multicast): pending until approved, let go when silent;
never at this machine's addresses, never in the stock devices' places.

The announcements come from python-zeroconf on loopback, as a board's responder sends them; the
boards they name live in a network namespace the test makes (tests/netns.py), on a LAN of
this machine that is not this machine.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from zeroconf import IPVersion
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from gateway.device_side.boards import board_id
from gateway.device_side.boards.discovery import NEW_BOARDS_BURST, Discovery, board_url_of
from gateway.devices.device import PENDING
from tests.conftest import bound, gateway
from tests.e2e.boards import BoardState, python_board, served
from tests.e2e.helpers import has_tools, until
from tests.e2e.test_device_trust import check_in
from tests.e2e.test_mqtt import STOCK
from tests.netns import Lan, lan, needs_lan

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

MCP = "_mcp._tcp.local."


@pytest.fixture(autouse=True)
def loopback_multicast_to_ourselves() -> Iterator[None]:
    """One test at a time on this machine's loopback multicast: every responder and browser on
    it hears every other, so another run beside this one (.ci/run runs two) would announce its
    boards to this test's gateway, and the same names twice."""
    with open(Path(tempfile.gettempdir()) / "esp-mcp-gateway-tests-mdns.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def announcement(name: str, address: str, port: int, path: str = "mcp") -> AsyncServiceInfo:
    """What a board's responder announces: ESP-Claw's shape (TXT ``endpoint``, no slash)."""
    return AsyncServiceInfo(MCP, f"{name}.{MCP}", port=port, addresses=[socket.inet_aton(address)],
                            properties={"endpoint": path},
                            server=f"{name.lower()}.local.")  # fmt: skip


@asynccontextmanager
async def announcing(*infos: AsyncServiceInfo) -> AsyncIterator[AsyncZeroconf]:
    """A responder on loopback announcing ``infos`` (more with ``async_register_service``)."""
    publisher = AsyncZeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
    try:
        # Names nobody else holds: no probing (RFC 6762 8.1), 200 of them announce in a moment.
        await asyncio.gather(*(publisher.async_register_service(info, cooperating_responders=True)
                               for info in infos))  # fmt: skip
        yield publisher
    finally:
        await publisher.async_close()


class Decided:
    """The announcements the gateway has looked up and decided, taken or ignored (a spy on
    ``Discovery._decide``, where each ends), for a test to wait on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self._changed = asyncio.Event()
        real = Discovery._decide

        def decide(discovery: Discovery, name: str, ignored: tuple[str, str] | None) -> None:
            real(discovery, name, ignored)
            self.count += 1
            self._changed.set()

        monkeypatch.setattr(Discovery, "_decide", decide)

    async def reach(self, count: int) -> None:
        """Wait until ``count`` announcements are decided."""
        with anyio.fail_after(bound(20)):
            while self.count < count:
                self._changed.clear()
                await self._changed.wait()


@pytest.fixture
def decided(monkeypatch: pytest.MonkeyPatch) -> Decided:
    return Decided(monkeypatch)


def browsing(where: Lan, **more: object) -> dict[str, object]:
    """The config of a gateway browsing on loopback and on the test's LAN."""
    return {"boards_discover": True, "boards_discover_interfaces": ("127.0.0.1", where.host),
            **more}  # fmt: skip


@asynccontextmanager
async def counting_listener(address: str) -> AsyncIterator[tuple[int, list[int]]]:
    """A TCP listener on ``address`` counting the connections it gets: ``(port, [count])``."""
    count = [0]

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        count[0] += 1
        writer.close()

    server = await asyncio.start_server(accepted, address, 0)
    try:
        yield server.sockets[0].getsockname()[1], count
    finally:
        server.close()
        await server.wait_closed()


def test_urls_from_what_boards_really_announce() -> None:
    """ESP-Claw's TXT endpoint (no slash), mcpd's path and whole-URL endpoint, or nothing."""
    assert board_url_of("10.0.0.5", 18791, {b"endpoint": b"mcp_server"}) == (
        "http://10.0.0.5:18791/mcp_server"
    )
    mcpd = {b"path": b"/mcp", b"endpoint": b"http://10.9.9.9:80/mcp"}
    assert board_url_of("10.0.0.6", 80, mcpd) == "http://10.0.0.6:80/mcp"
    assert board_url_of("10.0.0.7", 8080, {b"endpoint": b"http://evil.example/x"}) == (
        "http://10.0.0.7:8080/x"  # a TXT URL's host is never used: the announced address is
    )
    assert board_url_of("10.0.0.8", 8080, {}) == "http://10.0.0.8:8080/mcp"


@needs_lan
async def test_announced_board_is_pending_then_approved_then_let_go(tmp_path: Path) -> None:
    """Announced on this machine's LAN (the default networks): pending, nothing exposed;
    approved: listed and called; unannounced: offline after grace, its tools kept."""
    with lan() as where:
        async with served(python_board("claw", BoardState()).streamable_http_app(host=where.peer),
                          where.listen()) as base:  # fmt: skip
            port = int(base.rsplit(":", 1)[1])
            url = f"http://{where.peer}:{port}/mcp"
            info = announcement("ESP-Claw", where.peer, port)
            config = browsing(where, boards_discover_grace=bound(0.5))
            async with gateway(tmp_path, **config) as run, announcing() as publisher:
                registry = run.gateway.registry
                assert run.gateway.boards.networks == (where.network,)  # the LAN it is on

                def listed_pending() -> bool:
                    device = registry.get(board_id(url))
                    return (
                        device is not None and device.online and device.record.catalogue is not None
                    )

                async with registry.device_changes() as changes:
                    await publisher.async_register_service(info)
                    await until(changes, listed_pending)
                    device = registry.get(board_id(url))
                    assert device is not None and device.record.state == PENDING
                    async with Client(run.mcp_url, mode="legacy") as client:
                        before = [t.name for t in (await client.list_tools()).tools]
                    assert not any("greet" in name for name in before)  # nothing exposed
                    async with httpx2.AsyncClient() as http:
                        approved = await http.post(
                            f"http://127.0.0.1:{run.host_port}/api/devices/approve",
                            json={"device": board_id(url)},
                        )
                    assert approved.status_code == 200
                    await until(changes, has_tools(run, board_id(url)))
                    async with Client(run.mcp_url, mode="legacy") as client:
                        after = [t.name for t in (await client.list_tools()).tools]
                        greet = next(name for name in after if name.endswith("_greet"))
                        greeting = await client.call_tool(greet, {"who": "kim"})
                    await publisher.async_unregister_service(info)
                    await until(changes, lambda: not registry.get(board_id(url)).online)  # type: ignore[union-attr]
                    assert greet in [t.name for t in registry.exposed_tools()]  # offline memory
    assert greet.startswith("claw")  # named after the board's serverInfo
    assert greeting.content[0].text == "hello kim from claw"


@needs_lan
async def test_an_announcement_at_this_machine_is_never_contacted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, decided: Decided
) -> None:
    """Announced at 127.0.0.1, 127.0.0.2 or this machine's own address on the LAN (or at a
    link-local address, or off the LAN), with a port and path of the announcer's choice: no
    board, no connection, a line for each reason saying why; a board on the LAN announced
    after them is found."""
    caplog.set_level(logging.INFO, "gateway.device_side.boards")
    with lan() as where:
        async with (
            counting_listener("127.0.0.1") as (first, to_first),
            counting_listener("127.0.0.2") as (second, to_second),
            counting_listener(where.host) as (own, to_own),
            served(python_board("lan", BoardState()).streamable_http_app(host=where.peer),
                   where.listen()) as base,
        ):  # fmt: skip
            off_lan = str(where.network[-1] + 6)  # the next /24's .5
            refused = [("Loop", "127.0.0.1", first), ("Loop2", "127.0.0.2", second),
                       ("Own", where.host, own), ("Meta", "169.254.169.254", 80),
                       ("Far", off_lan, 80)]  # fmt: skip
            async with gateway(tmp_path, **browsing(where)) as run:
                async with announcing(*(announcement(n, a, p, "latest/meta-data/x?q=1")
                                        for n, a, p in refused)):  # fmt: skip
                    await decided.reach(len(refused))
                good = f"http://{where.peer}:{int(base.rsplit(':', 1)[1])}/mcp"
                registry = run.gateway.registry
                async with (
                    registry.device_changes() as changes,
                    announcing(announcement("Good", where.peer, int(base.rsplit(":", 1)[1]))),
                ):
                    await until(changes, lambda: bool((d := registry.get(board_id(good)))
                                                      and d.online))  # fmt: skip
                for _, address, port in refused:
                    url = board_url_of(address, port, {b"endpoint": b"latest/meta-data/x?q=1"})
                    assert run.gateway.boards.get(board_id(url)) is None
                    assert registry.get(board_id(url)) is None
                # A board held as discovered is checked again before each attempt
                assert run.gateway.boards.discovered(f"http://127.0.0.2:{second}/mcp") is None
                board = run.gateway.boards.get(board_id(f"http://127.0.0.2:{second}/mcp"))
                assert board is not None
                with anyio.fail_after(bound(10)):
                    await board.attempted.wait()
                assert board.problem == "127.0.0.2 leads to this machine"
    assert (to_first[0], to_second[0], to_own[0]) == (0, 0, 0)
    ignored = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(ignored) == 3  # each reason once in its interval: a bounded rate
    said = "\n".join(ignored)
    assert ", an address of this machine (a board here is yours to add by URL" in said
    assert "announced at 169.254.169.254, a link-local address" in said
    assert f"{off_lan}, outside the networks boards are discovered in ({where.network};" in said


@needs_lan
async def test_a_flood_of_announcements_leaves_the_stock_devices_places(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, decided: Decided
) -> None:
    """200 boards announced at one address: a few become pending (the address's burst), the
    rest are ignored in a line or two; the one place for stock devices is still free."""
    caplog.set_level(logging.INFO, "gateway.device_side.boards")
    with lan() as where:
        flood = [announcement(f"Flood{n}", where.peer, 20000 + n) for n in range(200)]
        async with gateway(tmp_path, **browsing(where), max_pending=1) as run:
            async with announcing(*flood):
                await decided.reach(len(flood))
            registry = run.gateway.registry
            discovered = [d for d in registry.devices() if d.device_id.startswith("mcp-")]
            urls = [f"http://{where.peer}:{20000 + n}/mcp" for n in range(200)]
            held = [url for url in urls if run.gateway.boards.get(board_id(url))]
            # The address's burst (and one more for each 30 s the lookups took), under the cap
            cap = run.gateway.config.boards_discover_max_pending
            assert NEW_BOARDS_BURST <= len(held) < cap
            assert len(discovered) <= len(held)
            assert all(d.record.state == PENDING for d in discovered)
            assert (await check_in(run)).status_code == 200
            stock = registry.get(STOCK)
            assert stock is not None and stock.record.state == PENDING
            assert list(registry.waiting) == [STOCK]
    ignored = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert 1 <= len(ignored) < 10 and "new boards" in ignored[0]  # a line per 10 s, not 196


@needs_lan
async def test_discovered_boards_wait_at_most_their_cap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, decided: Decided
) -> None:
    """Boards announced at 12 addresses of the LAN, at most 3 waiting: 3 are held, the others
    ignored with the reason; one that stops announcing is forgotten and frees its place."""
    caplog.set_level(logging.INFO, "gateway.device_side.boards")
    with lan() as where:
        hosts = [str(where.network[10 + n]) for n in range(12)]
        infos = [announcement(f"Board{n}", host, 8080) for n, host in enumerate(hosts)]
        config = browsing(where, boards_discover_max_pending=3, boards_discover_grace=bound(0.2))
        async with gateway(tmp_path, **config) as run:
            boards = run.gateway.boards
            async with announcing(*infos) as publisher:
                await decided.reach(len(infos))
                held = [info for info, host in zip(infos, hosts, strict=True)
                        if boards.get(board_id(f"http://{host}:8080/mcp"))]  # fmt: skip
                assert len(held) == 3
                registry = run.gateway.registry
                async with registry.device_changes() as changes:
                    await publisher.async_unregister_service(held[0])
                    gone = board_id(f"http://{held[0].parsed_addresses()[0]}:8080/mcp")
                    await until(changes, lambda: registry.get(gone) is None)
                late = announcement("Late", str(where.network[100]), 8080)
                await publisher.async_register_service(late)
                await decided.reach(len(infos) + 1)
                assert boards.get(board_id(f"http://{where.network[100]}:8080/mcp")) is not None
    ignored = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert ignored and "3 discovered boards wait for approval already" in ignored[0]
