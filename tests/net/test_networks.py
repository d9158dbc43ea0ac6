"""Tests for gateway.net.networks: this machine's interfaces and the LAN they are on."""

from __future__ import annotations

import ipaddress

from gateway.net.addresses import lan_address
from gateway.net.networks import in_networks, interface_networks


def test_the_lan_this_machine_is_on_and_never_loopback_or_link_local() -> None:
    found = interface_networks()
    assert not any(net.is_loopback or net.is_link_local for net in found)
    own = lan_address()
    if own is not None and own[0].isdigit():  # a machine with a LAN: its address's network
        assert in_networks(own, found)
        assert interface_networks([own]) == tuple(
            net for net in found if ipaddress.ip_address(own) in net
        )


def test_only_the_interfaces_named_by_their_addresses() -> None:
    assert interface_networks(["127.0.0.1"]) == ()  # loopback's network is never a LAN
    assert interface_networks(["192.0.2.254"]) == ()  # no interface holds it
