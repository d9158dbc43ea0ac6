"""Fleet scale: many stock devices against a real gateway process, and a bare baseline server.

Run from the repository root, in the project's venv::

    python bench/fleet.py [--count N] [--idle-count N] [--mqtt-count N] [--workers W]
                          [--list-counts N,N] [--only storm,join,idle,mqtt,list,mixed]
                          [--mixed-count N] [--mqtt-share F] [--json] [--timeout SECONDS]

The gateway runs as it does in production: ``esp-mcp-gateway serve`` in its own process, on
free loopback ports, with a fresh data directory, one shared device token and its stderr in a
log file (``_processes.Gateway``). The devices are lean stock-xiaozhi emulators, many per
asyncio loop in a few worker processes (``_fleet_run``). Each phase runs against a fresh
gateway and its baseline, each in a module of its own:

* **storm** (``_fleet_storm``): N WebSocket devices at once, against two bare baselines.
* **join**, **idle** (``_fleet_join``): one device joining, net of idle; a big idle fleet's
  memory and CPU.
* **mqtt** (``_fleet_mqtt``): the same devices over WebSocket, over MQTT, and against mosquitto
  with a minimal discovery client.
* **list** (``_fleet_list``): a host's whole ``tools/list`` against a bare SDK server's.
* **mixed** (``_fleet_mixed``, only when asked for: ``--only mixed``): a big idle fleet of both
  transports in one gateway, grown, listed and called.

It is a measurement, not a test: it exits 1 only when the run itself breaks (a process dies,
the ``--timeout`` passes), never over a figure. Every process it starts is gone when it ends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from _fleet_catalogue import PAGES, TOOL_COUNT
from _fleet_devices import PING_INTERVAL
from _fleet_join import idle_lines, join_and_idle, join_lines
from _fleet_list import LIST_MAX, list_lines, listing
from _fleet_mixed import MixedFleet, check_fits, mixed, mixed_lines
from _fleet_mqtt import mqtt, mqtt_lines
from _fleet_processes import Pool
from _fleet_run import DEVICE_TOKEN, device_ids
from _fleet_storm import storm, storm_lines
from _processes import RunBroken, kill_children, raise_fd_limit

PHASES = ("storm", "join", "idle", "mqtt", "list", "mixed")
DEFAULT_PHASES = PHASES[:-1]  # the mixed fleet is big: run only when asked for


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise RunBroken("the --timeout passed")


def table(figures: dict[str, Any]) -> str:
    """The figures as a table for people."""
    lines = [
        f"fleet: {figures['workers']} worker processes; each device serves {TOOL_COUNT} "
        f"tools in {len(PAGES)} tools/list pages"
    ]
    phases = {"storm": storm_lines, "join": join_lines, "idle": idle_lines,
              "mqtt": mqtt_lines, "list": list_lines, "mixed": mixed_lines}  # fmt: skip
    for phase, lines_of in phases.items():
        if phase in figures:
            lines += ["", *lines_of(figures[phase])]
    return "\n".join(lines)


@contextlib.contextmanager
def _bounded(seconds: float) -> Iterator[None]:
    """Raise RunBroken after ``seconds`` wherever the run is, then clean up every process."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        kill_children()


def measure(args: argparse.Namespace, phases: set[str], figures: dict[str, Any]) -> None:
    """Run the chosen phases, filling ``figures`` as each one ends."""
    raise_fd_limit()  # inherited by the gateway, the baseline and the workers
    with tempfile.TemporaryDirectory(prefix="bench-fleet-", ignore_cleanup_errors=True) as tmp:
        workdir = Path(args.log_dir) if args.log_dir else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        pool = Pool(args.workers)
        if "storm" in phases:
            figures["storm"] = storm(pool, workdir, args.count, args.storm_rounds)
        if phases & {"join", "idle"}:
            figures |= join_and_idle(pool, workdir, args, phases)
        if "mqtt" in phases:
            figures["mqtt"] = mqtt(pool, workdir, args.mqtt_count, args.mqtt_idle_seconds)
        if "list" in phases:
            listing(pool, workdir, args, figures)
        if "mixed" in phases:
            figures["mixed"] = mixed(pool, workdir, _mixed_fleet(args))


def _mixed_fleet(args: argparse.Namespace) -> MixedFleet:
    over_mqtt = round(args.mixed_count * args.mqtt_share)
    return MixedFleet(
        websocket=device_ids("mixed-ws", args.mixed_count - over_mqtt),
        mqtt=device_ids("mixed-mqtt", over_mqtt), warm_up=device_ids("warm-up", 1),
        token=DEVICE_TOKEN, idle_seconds=args.mixed_idle_seconds, calls=args.mixed_calls,
        leaves=args.mixed_leaves, workers=args.workers,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="devices in the storm")
    parser.add_argument("--storm-rounds", type=int, default=1,
                        help="storms against the lean baseline and a fresh gateway, for the "
                        "median of their CPU ratios")  # fmt: skip
    parser.add_argument("--idle-count", type=int, default=10000, help="devices in the fleet")
    parser.add_argument("--mqtt-count", type=int, default=1000, help="devices over MQTT")
    parser.add_argument("--list-counts", default="1000,10000", help="fleets to list, comma-sep.")
    parser.add_argument("--list-passes", type=int, default=3, help="whole listings per target")
    parser.add_argument("--workers", type=int, default=2, help="device worker processes")
    parser.add_argument("--joins", type=int, default=20, help="joins per join measurement")
    # One ping interval: each device's ping counts about once, wherever the window falls.
    parser.add_argument(
        "--idle-seconds", type=float, default=PING_INTERVAL, help="idle CPU window, s"
    )
    parser.add_argument(
        "--mqtt-idle-seconds", type=float, default=0.0,
        help="mqtt phase: each gateway's CPU over this long with its devices idle (0: not)",
    )  # fmt: skip
    parser.add_argument("--mixed-count", type=int, default=50000, help="devices in the mixed fleet")
    parser.add_argument("--mqtt-share", type=float, default=0.5, help="of them over MQTT, 0-1")
    parser.add_argument("--mixed-calls", type=int, default=50, help="calls through the host side")
    parser.add_argument("--mixed-leaves", type=int, default=0,
                        help="MQTT devices over this many mosquitto leaves bridged to a hub, "
                        "the gateway in external mode on it (0: the embedded broker)")  # fmt: skip
    # One MQTT keepalive (the OTA reply's 240 s): each MQTT device's PINGREQ counts about once.
    parser.add_argument("--mixed-idle-seconds", type=float, default=240.0,
                        help="the mixed fleet's idle CPU window, s")  # fmt: skip
    parser.add_argument("--only", default=",".join(DEFAULT_PHASES),
                        help=f"phases, comma-separated, of {','.join(PHASES)}")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--timeout", type=float, default=1800.0, help="bound on the whole run, s")
    parser.add_argument("--log-dir", help="keep the gateway logs here (default: a temp dir)")
    args = parser.parse_args()
    phases = {p.strip() for p in args.only.split(",") if p.strip()}
    if not phases or phases - set(PHASES):
        parser.error(f"--only takes some of {','.join(PHASES)}")
    try:
        args.list_counts = [int(c) for c in args.list_counts.split(",") if c.strip()]
    except ValueError:
        parser.error("--list-counts takes comma-separated device counts")
    counts = [args.count, args.idle_count, args.mqtt_count, *args.list_counts]
    least = min(*counts, args.workers, args.joins, args.list_passes, args.storm_rounds)
    if not args.list_counts or least < 1:
        parser.error("counts, --workers, --joins, --list-passes and --storm-rounds must be at "
                     "least 1")  # fmt: skip
    if max(args.list_counts) > LIST_MAX:
        parser.error(f"--list-counts: at most {LIST_MAX:,} devices (one alias each)")
    if not 0.0 <= args.mqtt_share <= 1.0 or min(args.mixed_calls, args.mixed_leaves) < 0:
        parser.error("--mqtt-share is a fraction from 0 to 1; --mixed-calls and "
                     "--mixed-leaves at least 0")  # fmt: skip
    raise_fd_limit()  # as the gateway will have it
    if "mixed" in phases and (unfit := check_fits(_mixed_fleet(args))) is not None:
        parser.error(f"--mixed-count: {unfit}")
    figures: dict[str, Any] = {"workers": args.workers}
    status = 0
    try:
        with _bounded(args.timeout):
            measure(args, phases, figures)
    except (RunBroken, OSError, ValueError) as exc:
        print(f"fleet: {type(exc).__name__}: {exc}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        print("fleet: interrupted", file=sys.stderr)
        status = 1
    if len(figures) > 1:  # what was measured before a break is still worth seeing
        print(json.dumps(figures, indent=2) if args.json else table(figures))
    return status


if __name__ == "__main__":
    sys.exit(main())
