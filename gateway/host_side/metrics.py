"""``/metrics``: the gateway in Prometheus text format.

Each gateway has its own ``CollectorRegistry`` (tests run many gateways in one process). What
can be read off the gateway's state (devices by state and transport, MCP sessions, rejected
tools, broker clients, refused connections) is read at scrape time; only events are counted as
they happen: calls (told by the audit log as each ends) and discoveries (told by the registry).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client import Counter as CounterMetric
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from gateway.devices.audit import AuditLog
from gateway.devices.events import EventStore
from gateway.devices.registry import APPROVED, DeviceView

__all__ = ["GatewayMetrics"]

_CALL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_HELD_CALLS = 256  # calls counted together at most (the rest wait for a scrape)
_DISCOVERY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class GatewayMetrics:
    """The gateway's metrics registry, and the ``/metrics`` view over it."""

    def __init__(
        self,
        registry: DeviceView,
        audit: AuditLog,
        *,
        mcp_sessions: Callable[[], int],
        broker_clients: Callable[[], Collection[str]] | None = None,
        device_events: EventStore | None = None,
        replica: str | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.calls = CounterMetric("gateway_calls", "Device tool calls by outcome",
                                   ["outcome"], registry=self.registry)  # fmt: skip
        self.call_seconds = Histogram("gateway_call_duration_seconds",
                                      "How long device tool calls took, policy checks included",
                                      buckets=_CALL_BUCKETS, registry=self.registry)  # fmt: skip
        self.discovery_seconds = Histogram(
            "gateway_discovery_duration_seconds",
            "From a device connecting to the gateway knowing its tools",
            buckets=_DISCOVERY_BUCKETS,
            registry=self.registry,
        )
        self.replica = replica  # cluster: every series labelled replica="<name>"
        self.refusals: dict[str, Callable[[], Mapping[str, int]]] = {}  # listener -> counts
        self.admissions_refused: Counter[str] = Counter()  # transport -> devices turned away
        self.device_events = device_events  # devices' events dropped or folded
        self._calls_by_outcome: dict[
            str, CounterMetric
        ] = {}  # the counter of each outcome, found once
        self._ended: list[tuple[str, float]] = []  # calls not counted yet: outcome, seconds
        self._state = _StateCollector(self, registry, mcp_sessions, broker_clients)
        self.registry.register(self._state)
        audit.subscribe_calls(self.call_ended)
        registry.subscribe_discoveries(self.discovery_seconds.observe)

    def count_refusals(self, listener: str, counts: Callable[[], Mapping[str, int]]) -> None:
        """Expose what ``listener``'s guard refused (its counts by reason), read at each scrape:
        the guards are made with the listeners, after this."""
        self.refusals[listener] = counts

    def call_ended(self, outcome: str, seconds: float) -> None:
        """Count one call (``AuditLog`` watcher).

        Held until the next scrape (or ``_HELD_CALLS`` of them): a call pays for an append,
        not for a counter and a histogram, each behind its lock.
        """
        ended = self._ended
        ended.append((outcome, seconds))
        if len(ended) >= _HELD_CALLS:
            self._count_calls()

    def _count_calls(self) -> None:
        ended, self._ended = self._ended, []
        for outcome, seconds in ended:
            # Outcomes are a handful of names (ok, rejected, cancelled, the DeviceError kinds).
            counter = self._calls_by_outcome.get(outcome)
            if counter is None:
                counter = self._calls_by_outcome[outcome] = self.calls.labels(outcome)
            counter.inc()
            self.call_seconds.observe(seconds)

    def admitted(self, refusal: str | None, transport: str) -> bool:
        """Count a device connection refused at admission (bad token, rejected, rebound)."""
        if refusal is not None:
            self.admissions_refused[transport] += 1
        return refusal is None

    async def endpoint(self, request: Request) -> Response:
        """``GET /metrics``."""
        self._count_calls()
        text = generate_latest(self.registry)
        if self.replica is not None:
            text = _labelled(text, self.replica)
        return Response(text, media_type=CONTENT_TYPE_LATEST)


def _labelled(text: bytes, replica: str) -> bytes:
    """Every sample of the exposition ``text`` with a ``replica`` label first."""
    label = f'replica="{replica}"'.encode()
    lines = []
    for line in text.split(b"\n"):
        if line and not line.startswith(b"#"):
            name, brace, rest = line.partition(b"{")
            if brace:
                line = name + b"{" + label + (b"," if not rest.startswith(b"}") else b"") + rest
            else:
                name, _, value = line.partition(b" ")
                line = name + b"{" + label + b"} " + value
        lines.append(line)
    return b"\n".join(lines)


class _StateCollector(Collector):
    """Gauges read off the gateway at each scrape."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        registry: DeviceView,
        mcp_sessions: Callable[[], int],
        broker_clients: Callable[[], Collection[str]] | None,
    ) -> None:
        self._metrics, self._registry = metrics, registry
        self._sessions, self._broker = mcp_sessions, broker_clients

    def describe(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        return []  # names known only at collect time are fine; nothing to check up front

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        devices = GaugeMetricFamily("gateway_devices", "Known devices by state and transport",
                                    labels=["state", "transport"])  # fmt: skip
        counts: Counter[tuple[str, str]] = Counter()
        rejected = 0
        for device in self._registry.devices():
            state = device.record.state
            if state == APPROVED:
                state = "online" if device.online else "offline"
            counts[state, device.record.transport or "none"] += 1
            rejected += len(device.rejected)
        for (state, transport), count in sorted(counts.items()):
            devices.add_metric([state, transport], count)
        yield devices
        yield GaugeMetricFamily("gateway_rejected_tools",
                                "Device tools not served: invalid name, description or schema",
                                value=rejected)  # fmt: skip
        yield GaugeMetricFamily("gateway_mcp_sessions", "Connected MCP sessions (stateful)",
                                value=self._sessions())  # fmt: skip
        if self._broker is not None:
            yield GaugeMetricFamily("gateway_broker_clients",
                                    "Device clients connected to the embedded MQTT broker",
                                    value=len(self._broker()))  # fmt: skip
        refused = CounterMetricFamily("gateway_refused_connections",
                                      "Connections refused or closed by a listener's limits, and "
                                      "device connections refused at admission",
                                      labels=["listener", "reason"])  # fmt: skip
        for listener, counts_of in sorted(self._metrics.refusals.items()):
            for reason, count in sorted(counts_of().items()):
                refused.add_metric([listener, reason], count)
        for transport, count in sorted(self._metrics.admissions_refused.items()):
            refused.add_metric([transport, "admission"], count)
        yield refused
        events = self._metrics.device_events
        if events is not None:
            held = CounterMetricFamily("gateway_device_events_not_kept",
                                       "Device events dropped (device not approved) or folded "
                                       "into a later one (the device's rate)",
                                       labels=["reason"])  # fmt: skip
            held.add_metric(["not_approved"], events.dropped)
            held.add_metric(["coalesced"], events.coalesced)
            yield held
