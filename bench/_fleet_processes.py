"""The processes of ``fleet.py`` beside the gateway (``_processes.Gateway``): the device
workers and the baseline servers, each registered in ``_processes.CHILDREN``."""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from _fleet_devices import FleetSpec, Outcome, baseline_main, worker_main
from _lean_baseline import lean_baseline_main
from _listing_baseline import listing_main
from _processes import CHILDREN, ChildServer, RunBroken, cpu_s


class Pool:
    """Worker processes holding the devices; requests go to every worker at once."""

    def __init__(self, size: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes: list[Connection] = []
        self.pids: list[int] = []
        for index in range(size):
            parent, child = context.Pipe()
            process = context.Process(
                target=worker_main, args=(child,), daemon=True, name=f"fleet-worker-{index}"
            )
            process.start()
            child.close()
            CHILDREN.append(process)
            self.pipes.append(parent)
            self.pids.append(process.pid or 0)
        # Spawned workers import for a second or more (longer on a busy machine): a group
        # started meanwhile would begin late, and its times would count the imports.
        self.ask("ready", "", [None] * size, timeout=120)

    def cpu_s(self) -> float:
        """CPU time of all the workers so far, in seconds."""
        return sum(cpu_s(pid) for pid in self.pids)

    def ask(self, op: str, group: str, args: Sequence[Any], timeout: float = 60.0) -> list[Any]:
        """Send worker i ``(op, group, args[i])``; return the replies in worker order."""
        for pipe, arg in zip(self.pipes, args, strict=True):
            pipe.send((op, group, arg))
        replies = []
        for index, pipe in enumerate(self.pipes):
            if not pipe.poll(timeout):
                raise RunBroken(f"worker {index} did not answer {op!r} within {timeout:g} s")
            status, value = pipe.recv()
            if status != "ok":
                raise RunBroken(f"worker {index}: {op}: {value}")
            replies.append(value)
        return replies

    def start(
        self, group: str, spec: FleetSpec, ids: list[str], brokers: Sequence[str] = ()
    ) -> None:
        """Start ``ids`` split evenly over the workers; with ``brokers``, worker i's MQTT
        devices connect to ``brokers[i % len(brokers)]``."""
        size = len(self.pipes)
        chunks = [ids[i * len(ids) // size : (i + 1) * len(ids) // size] for i in range(size)]
        specs = [replace(spec, ids=tuple(chunk)) for chunk in chunks]
        if brokers:
            specs = [replace(s, broker=brokers[i % len(brokers)]) for i, s in enumerate(specs)]
        self.ask("start", group, specs)

    def wait(self, group: str, seconds: float) -> tuple[int, int, int]:
        """Wait up to ``seconds`` for the group; return (listed, failed, total)."""
        counts = self.ask("wait", group, [seconds] * len(self.pipes), timeout=seconds + 30)
        listed, failed, total = (sum(c[i] for c in counts) for i in range(3))
        return listed, failed, total

    def results(self, group: str) -> list[Outcome]:
        return [o for chunk in self.ask("results", group, [None] * len(self.pipes)) for o in chunk]

    def stop(self, group: str) -> None:
        self.ask("stop", group, [None] * len(self.pipes))


class Baseline(ChildServer):
    """The bare websockets server, in its own process; ``lean``: the one of ``_lean_baseline``."""

    def __init__(self, token: str, *, lean: bool = False) -> None:
        what, main = ("lean baseline", lean_baseline_main) if lean else ("baseline server",
                                                                         baseline_main)  # fmt: skip
        super().__init__(what, main, (token,), 30)
        self.url = f"ws://127.0.0.1:{self.started}/xiaozhi/v1/"


class ListBaseline(ChildServer):
    """The bare SDK server listing a fleet's tools (``_listing_baseline``), in its own process."""

    def __init__(self, device_ids: list[str], timeout: float = 600.0) -> None:
        super().__init__("list baseline", listing_main, (device_ids,), timeout)
        self.url = f"http://127.0.0.1:{self.started['port']}/mcp"
        self.tools, self.pages = int(self.started["tools"]), int(self.started["pages"])
        self.build_s = float(self.started["build_s"])
