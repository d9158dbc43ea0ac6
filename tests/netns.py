"""A LAN the test makes itself: a network namespace one veth pair away from this machine.

This machine's end of the pair gets ``Lan.host`` (``10.x.y.1/24``), the namespace's end
``Lan.peer`` (``.2``): an address on one of this machine's networks that is not this machine's,
as a board on the owner's LAN is. ``Lan.listen()`` makes a listening socket in the namespace (a
child process there binds it and hands it over, SCM_RIGHTS), so this process serves a board
there. Needs root and iproute2's ``ip`` (CI has both); traffic stays on the pair.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from gateway.net.networks import interface_networks
from tests.conftest import bound

__all__ = ["Lan", "lan", "needs_lan"]

needs_lan = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None,
    reason="a network namespace needs root and ip (CI has both)",
)

_made = itertools.count()
_CHOICES = 64 * 256  # the /24s of 10.192.0.0/10
# The child in the namespace: bind, listen, hand the socket over the inherited UNIX socket.
_LISTEN = (
    "import socket, sys\n"
    "sock = socket.socket(); sock.bind((sys.argv[1], 0)); sock.listen(64)\n"
    "socket.send_fds(socket.socket(fileno=int(sys.argv[2])), [b's'], [sock.fileno()])\n"
)


@dataclass(frozen=True)
class Lan:
    """The namespace ``name`` on ``network``: this machine is ``host``, the namespace ``peer``."""

    name: str
    network: ipaddress.IPv4Network
    host: str
    peer: str

    def listen(self) -> socket.socket:
        """A TCP socket listening on ``peer`` (port chosen by the kernel), in the namespace."""
        ours, theirs = socket.socketpair()
        with ours, theirs:
            subprocess.run(["ip", "netns", "exec", self.name, sys.executable, "-c", _LISTEN,
                            self.peer, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                           check=True, timeout=bound(10))  # fmt: skip
            _, fds, _, _ = socket.recv_fds(ours, 1, 1)
        return socket.socket(fileno=fds[0])


@contextmanager
def lan() -> Iterator[Lan]:
    """A new namespace and veth pair on a /24 no interface here is on; removed afterwards."""
    n = next(_made)
    tag = f"{os.getpid():x}{n:x}"
    network = _free_network(os.getpid() * 8 + n)  # other runs on this machine start elsewhere
    host, peer = str(network[1]), str(network[2])
    name, here, there = f"gwtest-{tag}", f"gw{tag}h", f"gw{tag}n"
    commands = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", here, "type", "veth", "peer", "name", there, "netns", name],
        ["ip", "addr", "add", f"{host}/24", "dev", here],
        ["ip", "link", "set", here, "up"],
        ["ip", "-n", name, "addr", "add", f"{peer}/24", "dev", there],
        ["ip", "-n", name, "link", "set", there, "up"],
        ["ip", "-n", name, "link", "set", "lo", "up"],
    ]
    try:
        for command in commands:
            subprocess.run(command, check=True, capture_output=True, timeout=bound(10))
        yield Lan(name, network, host, peer)
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=bound(10))
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=bound(10))


def _free_network(start: int) -> ipaddress.IPv4Network:
    """A /24 of 10.192.0.0/10 that none of this machine's interfaces is on, from ``start``."""
    taken = [net for net in interface_networks() if net.version == 4]
    for i in range(_CHOICES):
        k = (start + i) % _CHOICES
        candidate = ipaddress.IPv4Network(f"10.{192 + k // 256}.{k % 256}.0/24")
        if not any(candidate.overlaps(net) for net in taken):
            return candidate
    raise RuntimeError("every /24 of 10.192.0.0/10 is on an interface of this machine")
