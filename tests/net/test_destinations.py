"""Tests for gateway.net.destinations: checked after resolution, every spelling alike."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from gateway.net import destinations
from gateway.net.addresses import lan_address
from gateway.net.destinations import (
    LINK_LOCAL,
    OUTSIDE,
    THIS_MACHINE,
    DestinationRefused,
    address_reach,
    literal_reach,
    reach_of,
    resolve_destination,
)
from gateway.net.networks import networks

pytestmark = pytest.mark.anyio

LOOPBACK_FORMS = ["127.0.0.1", "127.1", "0", "0.0.0.0", "2130706433", "0x7f000001",
                  "0177.0.0.1", "127.0.0.1.", "localhost", "localhost.", "LOCALHOST",
                  "[::1]", "::1", "::ffff:127.0.0.1", "[::ffff:7f00:1]", "::",
                  "127.255.0.9"]  # fmt: skip
LINK_LOCAL_FORMS = ["169.254.169.254", "169.254.169.254.", "2852039166", "0xa9fea9fe",
                    "0251.0376.0251.0376", "169.254.43518", "[fe80::1]",
                    "::ffff:169.254.169.254"]  # fmt: skip


@pytest.mark.parametrize("host", LOOPBACK_FORMS)
async def test_every_spelling_of_this_machine_is_refused(host: str) -> None:
    with pytest.raises(DestinationRefused, match="this machine") as refused:
        await resolve_destination(host, 8000)
    assert refused.value.place == THIS_MACHINE
    destination = await resolve_destination(host, 8000, allow={THIS_MACHINE})
    assert address_reach(destination.address) == THIS_MACHINE  # what is connected is checked


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]"])
async def test_own_ports_narrow_this_machine_to_the_gateways_listeners(host: str) -> None:
    """A board beside the gateway is reached; the gateway's own port and link-local are not."""
    destination = await resolve_destination(host, 8000, own_ports={8080, 1883})
    assert address_reach(destination.address) == THIS_MACHINE
    with pytest.raises(DestinationRefused, match="this machine") as refused:
        await resolve_destination(host, 8080, own_ports={8080, 1883})
    assert refused.value.place == THIS_MACHINE
    with pytest.raises(DestinationRefused, match="link-local"):
        await resolve_destination("169.254.169.254", 8000, own_ports={8080})


async def test_a_localhost_name_is_this_machine_whatever_the_resolver_says() -> None:
    with pytest.raises(DestinationRefused, match="this machine"):
        await resolve_destination("voice.localhost", 8000)


@pytest.mark.parametrize("host", LINK_LOCAL_FORMS)
async def test_every_spelling_of_the_link_local_network_is_refused(host: str) -> None:
    with pytest.raises(DestinationRefused, match="link-local") as refused:
        await resolve_destination(host, 80, allow={THIS_MACHINE})
    assert refused.value.place == LINK_LOCAL
    assert await reach_of(host) == LINK_LOCAL


async def test_this_machines_own_lan_address_is_this_machine() -> None:
    own = lan_address()
    if own is None or not own[0].isdigit():
        pytest.skip("this machine has no LAN address")
    with pytest.raises(DestinationRefused, match="this machine"):
        await resolve_destination(own, 8000)


@pytest.mark.parametrize("host", ["192.168.1.10", "10.0.0.7", "8.8.8.8", "[2001:db8::1]"])
async def test_other_machines_pass_as_the_address_to_connect_to(host: str) -> None:
    destination = await resolve_destination(host, 443)
    assert destination.address == host.strip("[]") and destination.port == 443
    assert await reach_of(host) is None


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "0.0.0.0", "[::1]", "::ffff:127.0.0.2"])
async def test_within_networks_this_machine_is_refused_at_every_port(host: str) -> None:
    """An address a LAN peer chose (mDNS) never leads to this machine, whatever its port and
    whatever the networks allowed."""
    everywhere = networks(["0.0.0.0/0", "::/0"])
    with pytest.raises(DestinationRefused, match="this machine") as refused:
        await resolve_destination(host, 8000, own_ports={8080}, within=everywhere)
    assert refused.value.place == THIS_MACHINE


async def test_within_networks_only_those_are_reached_and_link_local_never() -> None:
    lan = networks(["192.168.1.0/24"])
    destination = await resolve_destination("192.168.1.10", 80, within=lan)
    assert destination.address == "192.168.1.10"
    for host in ("192.168.2.10", "10.0.0.7", "8.8.8.8", "[2001:db8::1]"):
        with pytest.raises(DestinationRefused, match="outside the networks allowed") as refused:
            await resolve_destination(host, 80, within=lan)
        assert refused.value.place == OUTSIDE
    assert address_reach("169.254.169.254", networks(["169.254.0.0/16"])) == LINK_LOCAL
    assert address_reach("fe80::1", networks(["fe80::/10"])) == LINK_LOCAL
    assert address_reach("not an address", lan) == OUTSIDE
    own = lan_address()
    if own is not None and own[0].isdigit():  # this machine's LAN address, on its own LAN
        assert address_reach(own, networks([f"{own}/24"])) == THIS_MACHINE


@pytest.mark.parametrize("host", ["", ".", "no-such-host.invalid", "a b", "[::1"])
async def test_what_does_not_resolve_is_refused_with_no_place(host: str) -> None:
    with pytest.raises(DestinationRefused) as refused:
        await resolve_destination(host, 80)
    assert refused.value.place is None


async def test_a_port_out_of_range_is_refused() -> None:
    with pytest.raises(DestinationRefused):
        await resolve_destination("192.168.1.10", 0)


async def test_a_name_with_one_loopback_address_among_others_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = {"mixed.example": ["192.0.2.10", "127.0.0.1"], "public.example": ["192.0.2.10"]}
    patch_resolver(monkeypatch, answers)
    with pytest.raises(DestinationRefused, match="mixed.example leads to this machine"):
        await resolve_destination("mixed.example", 80)
    destination = await resolve_destination("public.example.", 80)
    assert (destination.host, destination.address) == ("public.example", "192.0.2.10")


def test_binding_tells_own_addresses_only_when_non_local_binds_fail() -> None:
    # ip_nonlocal_bind on would make every address "own": then own addresses are not guessed.
    assert destinations._binding_tells() is not destinations._binds("192.0.2.1")


def patch_resolver(
    monkeypatch: pytest.MonkeyPatch, answers: Mapping[str, list[str] | Callable[[], list[str]]]
) -> list[str]:
    """Resolve the names of ``answers`` (each a list, or what makes one at each look; other
    names as before) on every event loop; return the names asked, in order."""
    asked: list[str] = []
    real = asyncio.BaseEventLoop.getaddrinfo

    async def getaddrinfo(self: Any, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(str(host))
        if host in answers:
            answer = answers[host]
            found = answer if isinstance(answer, list) else answer()
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in found]
        return await real(self, host, port, *args, **kwargs)

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", getaddrinfo)
    return asked


@pytest.mark.parametrize("host", [*LOOPBACK_FORMS, *LINK_LOCAL_FORMS, "app.localhost"])
def test_every_numeric_spelling_is_known_without_dns(host: str) -> None:
    """For an early answer (a setting as received): the same place as once resolved."""
    assert literal_reach(host) in (THIS_MACHINE, LINK_LOCAL)


@pytest.mark.parametrize("host", ["192.168.1.10", "voice.example", "8.8.8.8", "[2001:db8::1]"])
def test_names_and_other_machines_are_left_to_resolution(host: str) -> None:
    assert literal_reach(host) is None
