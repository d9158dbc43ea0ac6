"""The benchmarks still run (their figures are read by people, never asserted here)."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway.devices.name_rules import META_TOOL_NAMES
from tests.conftest import bound, program

BENCH = Path(__file__).resolve().parent.parent / "bench"
META = len(META_TOOL_NAMES)  # the meta-tools page one starts with


@pytest.mark.anyio
@pytest.mark.e2e
@pytest.mark.parametrize("device", [None, "simulator"])
async def test_call_latency_benchmark_runs_and_reports_both_targets(device: str | None) -> None:
    """`bench/call_latency.py --json` measures both targets, the device hop alone and the host
    side alone, and prints their ratio and what the gateway adds with and without its hop; the
    device runs in a process of its own unless asked to run in the bench's (``simulator``)."""
    # A few warm-up calls, not the benchmark's 50: the figures are not read here.
    args = ["--calls", "4", "--warmup", "3", "--json", *(["--device", device] if device else [])]
    with anyio.fail_after(bound(120)):
        done = await anyio.run_process(
            [sys.executable, str(BENCH / "call_latency.py"), *args], check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    figures = json.loads(done.stdout)
    assert figures["device"] == (device or "process")
    assert figures["baseline"]["calls"] == figures["gateway"]["calls"] == figures["hop"]["calls"]
    assert figures["hop"]["calls"] == figures["mcp"]["calls"] == 4
    assert figures["ratio"]["median"] > 0 and figures["ratio"]["cpu"] > 0
    added = figures["added_ms"]
    assert added["median"] - added["beyond_hop"] == pytest.approx(figures["hop"]["median_ms"])
    assert figures["gc"] == "settled"  # as serve runs the gateway
    assert all(figures[name]["gc_ms"] >= 0 for name in ("baseline", "gateway", "hop", "mcp"))


@pytest.mark.anyio
@pytest.mark.e2e
async def test_call_blackbox_benchmark_runs_both_servers_in_processes_of_their_own() -> None:
    """`bench/call_blackbox.py --json` starts the gateway as a user does, its device and a bare
    SDK server, each in a process of its own, and reports both servers' latency and throughput
    over its rounds, their ratio and what the gateway adds."""
    args = [
        "--calls",
        "4",
        "--rounds",
        "2",
        "--sessions",
        "2",
        "--burst",
        "2",
        "--warmup",
        "1",
        "--json",
    ]
    with anyio.fail_after(bound(120)):
        done = await anyio.run_process(
            [sys.executable, str(BENCH / "call_blackbox.py"), *args], check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    figures = json.loads(done.stdout)
    assert (figures["rounds"], figures["sessions"], figures["burst"]) == (2, 2, 2)
    for name in ("bare", "gateway", "gateway/bare"):
        for key in ("median_ms", "p99_ms", "calls_per_s"):
            spread = figures[name][key]
            assert 0 < spread["low"] <= spread["median"] <= spread["high"]
    # Two rounds: each median is their mean, and the mean of differences the difference of means.
    assert figures["gateway added"]["median_ms"]["median"] == pytest.approx(
        figures["gateway"]["median_ms"]["median"] - figures["bare"]["median_ms"]["median"]
    )


@pytest.mark.anyio
@pytest.mark.e2e
@pytest.mark.parametrize("device", ["process", "simulator"])
async def test_call_work_benchmark_counts_what_a_call_costs(device: str) -> None:
    """`bench/call_work.py --json` counts per call of each target its loop turns, callbacks,
    connections (fewer through the gateway than the bare server's) and Python calls, and times
    the device hop hot and cold: a call through the gateway is its host side plus its hop, turn
    for turn (give or take a timer's) when the device is in the bench's loop; with the device in
    its own process, its reply may come a turn or more later (the turns are then at least the
    two added). On a busy machine the hop alone may also take more turns than its usual two (its
    reply read in pieces, a timer): the gateway's call is held to the usual two, not to whatever
    the hop's own window took."""
    args = ["--calls", "4", "--warmup", "3", "--json", "--device", device]
    with anyio.fail_after(bound(120)):
        done = await anyio.run_process(
            [sys.executable, str(BENCH / "call_work.py"), *args], check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    figures = json.loads(done.stdout)
    assert figures["device"] == device
    gateway, mcp, hop = figures["gateway"], figures["mcp"], figures["hop"]
    # A timer (the audit log's write) may fire in a turn of its own in one window, not another.
    if device == "simulator":
        assert abs(gateway["turns"] - (mcp["turns"] + hop["turns"])) <= 1
    else:
        assert gateway["turns"] >= mcp["turns"] + 2 - 1
    # The bare SDK server's streamed answers cost the host a connection a call; the
    # gateway's JSON answers (host_side/json_answers.py) let it keep one.
    assert hop["connections"] == 0 and figures["baseline"]["connections"] >= 1
    assert gateway["connections"] < figures["baseline"]["connections"]
    assert gateway["python_calls"] > hop["python_calls"] > 0
    assert all(value > 0 for value in figures["hop_timed"].values())


@pytest.mark.anyio
@pytest.mark.e2e
async def test_listing_after_join_benchmark_measures_both_trees_in_both_modes() -> None:
    """`bench/listing_after_join.py --json --tree` measures the listing after a join in both
    modes, for this tree and the other (here this one again), each in a process of its own."""
    args = ["--counts", "30", "--joins", "1", "--json", "--tree", str(BENCH.parent)]
    with anyio.fail_after(bound(120)):
        done = await anyio.run_process(
            [sys.executable, str(BENCH / "listing_after_join.py"), *args], check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    rows = json.loads(done.stdout)
    assert [(row["count"], row["mode"]) for row in rows] == [(30, "auto"), (30, "per-device")]
    for row in rows:
        assert row["this"]["tools"] == row["tree"]["tools"]  # per-device: the first page
        assert (
            row["this"]["tools"] == 25 + META
            if row["mode"] == "auto"
            else row["this"]["tools"] > 25 + META
        )
        assert row["cpu_ratio"] > 0 and row["this"]["first_cpu_ms"] > 0


# fmt: off
TINY_FLEET = ["--count", "4", "--idle-count", "4", "--mqtt-count", "3", "--joins", "2",
              "--idle-seconds", "1", "--list-counts", "3", "--list-passes", "2", "--json",
              "--mqtt-idle-seconds", "1"]
# fmt: on


async def _fleet_bench(*phases: str, extra: list[str] | None = None) -> dict[str, Any]:
    """`bench/fleet.py --json` at tiny scale, only ``phases`` (``extra`` arguments): its
    figures."""
    args = [*TINY_FLEET, *(extra or []), "--only", ",".join(phases), "--timeout", str(bound(100))]
    with anyio.fail_after(bound(120)):
        done = await anyio.run_process([sys.executable, str(BENCH / "fleet.py"), *args],
                                       check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


@pytest.mark.anyio
@pytest.mark.e2e
async def test_fleet_benchmark_runs_every_phase_at_tiny_scale() -> None:
    """`bench/fleet.py --json` runs every phase but MQTT's against a real gateway process."""
    figures = await _fleet_bench("storm", "join", "idle", "list", extra=["--storm-rounds", "2"])
    assert figures["storm"]["baseline"]["listed"] == figures["storm"]["gateway"]["visible"] == 4
    assert figures["idle"]["fill"]["visible"] == 4
    assert figures["idle"]["rss_after_kb"] > 0
    assert figures["join"]["empty"]["failed"] == figures["join"]["fleet"]["failed"] == 0
    assert figures["storm"]["lean"]["listed"] == 4
    assert "cpu_ratio_lean" in figures["storm"]  # None when a tiny storm takes no CPU tick
    # a second round against the lean baseline and a fresh gateway (the gateway first)
    assert [set(r) for r in figures["storm"]["rounds"]] == [
        {"lean_cpu_s", "gateway_cpu_s", "cpu_ratio_lean"}
    ] * 2
    assert "cpu_ratio_lean_median" in figures["storm"]
    [listed] = figures["list"]["fleets"]
    assert listed["expected_tools"] == 3 * 25 + META
    for target in ("baseline", "gateway"):
        first = listed[target]["first"]
        assert first["tools"] == first["unique"] == listed["expected_tools"]
        assert len(listed[target]["later_s"]) == 1
    assert listed["same_names"]


@pytest.mark.anyio
@pytest.mark.e2e
async def test_fleet_benchmark_runs_its_mqtt_phase_at_tiny_scale() -> None:
    """The MQTT phase: the same devices over WebSocket, the embedded broker, and mosquitto with
    a minimal discovery client (its baseline, so it needs mosquitto)."""
    program("mosquitto")  # skips, saying what to install, where it is missing
    mqtt = (await _fleet_bench("mqtt"))["mqtt"]
    assert mqtt["websocket"]["visible"] == mqtt["mqtt"]["visible"] == 3
    assert mqtt["mosquitto"]["listed"] == 3
    assert mqtt["ratio_websocket"] and mqtt["ratio_mosquitto"]
    assert mqtt["mqtt"]["idle_cpu_percent"] >= 0 and mqtt["websocket"]["idle_seconds"] >= 1


@pytest.mark.anyio
@pytest.mark.e2e
async def test_fleet_benchmark_runs_its_mixed_phase_at_tiny_scale() -> None:
    """The mixed fleet: WebSocket and MQTT devices in one gateway, grown, online in its own
    count, listed whole by a host and called through it, one call per device here."""
    args = ["--mixed-count", "6", "--mqtt-share", "0.5", "--mixed-calls", "6",
            "--mixed-idle-seconds", "1"]  # fmt: skip
    mixed = (await _fleet_bench("mixed", extra=args))["mixed"]
    assert mixed["websocket_devices"] == mixed["mqtt_devices"] == 3
    assert mixed["grow"]["ws"]["listed"] == mixed["grow"]["mqtt"]["listed"] == 3
    assert mixed["grow"]["online"] == {"websocket": 3, "mqtt": 3}
    # 150 device tools exceed the default budget of 128: grouped, one entry per shared tool
    assert mixed["list"]["tools"] == mixed["list"]["unique"] == 25 + META
    assert mixed["calls"]["count"] == 6 and mixed["calls"]["errors"] == 0
    assert mixed["rss_after_kb"] > 0 and mixed["idle_cpu_percent"] >= 0


@pytest.mark.anyio
@pytest.mark.e2e
async def test_fleet_benchmark_runs_its_mixed_phase_over_bridged_brokers() -> None:
    """The mixed fleet's MQTT devices through two mosquitto leaves bridged to a hub, the
    gateway in external mode on the hub: every device listed, online and callable through it."""
    program("mosquitto")  # skips, saying what to install, where it is missing
    args = ["--mixed-count", "8", "--mqtt-share", "0.5", "--mixed-calls", "8",
            "--mixed-idle-seconds", "1", "--mixed-leaves", "2"]  # fmt: skip
    mixed = (await _fleet_bench("mixed", extra=args))["mixed"]
    assert mixed["leaves"] == 2
    assert mixed["grow"]["ws"]["listed"] == mixed["grow"]["mqtt"]["listed"] == 4
    assert mixed["grow"]["online"] == {"websocket": 4, "mqtt": 4}
    assert mixed["calls"]["count"] == 8 and mixed["calls"]["errors"] == 0
    assert set(mixed["brokers_rss_kb"]) == {"hub", "leaf-0", "leaf-1"}
    assert mixed["log"] == {"discovery_timeouts": 0, "warnings": 0, "errors": 0}


@pytest.mark.anyio
@pytest.mark.e2e
@pytest.mark.parametrize(
    ("per_limit", "share", "leaves", "says"),
    [
        (3.0, "0.5", "0", b"on the gateway's sockets, at most"),
        (3.0, "1", "2", b"MQTT devices on a leaf broker"),
        (1.5, "0.5", "2", b"devices in a worker process"),
    ],
)
async def test_fleet_benchmark_refuses_a_mixed_fleet_beyond_the_open_file_limit(
    per_limit: float, share: str, leaves: str, says: bytes
) -> None:
    """More devices than some process (the gateway, a leaf broker, a worker) may hold
    sockets: a clear error naming which, before anything starts."""
    count = int(per_limit * resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    args = [sys.executable, str(BENCH / "fleet.py"), "--only", "mixed", "--mixed-count",
            str(count), "--mqtt-share", share, "--mixed-leaves", leaves,
            "--workers", "1"]  # fmt: skip
    with anyio.fail_after(bound(60)):
        done = await anyio.run_process(args, check=False)
    assert done.returncode == 2
    assert says in done.stderr


@pytest.mark.anyio
@pytest.mark.e2e
async def test_cluster_benchmark_runs_at_tiny_scale() -> None:
    """`bench/cluster.py --json`: three replicas on mosquitto against one gateway."""
    program("mosquitto")  # skips, saying what to install, where it is missing
    with anyio.fail_after(bound(120)):
        done = await anyio.run_process(
            [sys.executable, str(BENCH / "cluster.py"), "--count", "6", "--calls", "4",
             "--records", "300", "--json"],
            check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    figures = json.loads(done.stdout)
    assert figures["cluster"]["listed"] == figures["single"]["listed"] == 6
    assert figures["calls"]["across"]["broker_publishes_per_call"] >= 2
    assert len(figures["rss_kb"]["replicas"]) == 3
    restart = figures["restart"]  # a replica cold, then warm from its data dir
    assert restart["records"] == 300
    for start in ("cold", "warm"):
        assert 0 < restart[start]["healthz_s"] <= restart[start]["caught_up_s"]


@pytest.mark.anyio
@pytest.mark.e2e
async def test_voice_proxy_benchmark_runs_and_reports_every_target() -> None:
    """`bench/voice_proxy.py --json` times frames direct, relayed and through the gateway."""
    tiny = ["--frames", "20", "--conversations", "3", "--seconds", "1", "--json",
            "--timeout", str(bound(100))]  # fmt: skip
    with anyio.fail_after(bound(120)):
        done = await anyio.run_process(
            [sys.executable, str(BENCH / "voice_proxy.py"), *tiny], check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    figures = json.loads(done.stdout)
    assert figures["latency"]["frames"] == 20
    for target in ("direct", "relay", "gateway"):
        assert 0 < figures["latency"][target]["p50_ms"] <= figures["latency"][target]["p99_ms"]
    assert figures["cpu"]["conversations"] == 3 and figures["cpu"]["gateway_core_pct"] > 0
    assert figures["gateway_log"]["errors"] == 0


@pytest.mark.anyio
@pytest.mark.e2e
async def test_voice_mqtt_benchmark_runs_and_reports_both_targets() -> None:
    """`bench/voice_mqtt.py --json` times messages direct and through the gateway's MQTT relay."""
    program("mosquitto")
    tiny = ["--messages", "10", "--json", "--timeout", str(bound(100))]
    with anyio.fail_after(bound(120)):
        done = await anyio.run_process(
            [sys.executable, str(BENCH / "voice_mqtt.py"), *tiny], check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    figures = json.loads(done.stdout)
    assert figures["messages"] == 10
    for target in ("direct", "gateway"):
        assert 0 < figures[target]["p50_ms"] <= figures[target]["p99_ms"]
    assert figures["gateway_log"]["errors"] == 0
