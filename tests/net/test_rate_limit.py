"""Token buckets per address, and the 429 a handler gets behind one (clock in, answers out)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.net.limits import networks
from gateway.net.rate_limit import RateLimiter, configured_limiter, rate_limited
from tests.conftest import make_config

pytestmark = pytest.mark.anyio


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_passes_then_the_rate_holds_and_refills() -> None:
    """burst at once, then one per 60/per_minute seconds; the wait says exactly when."""
    clock = Clock()
    limiter = RateLimiter(per_minute=6, burst=3, clock=clock)  # one every 10 s
    assert [limiter.wait("10.0.0.1") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.wait("10.0.0.1") == pytest.approx(10.0)
    assert limiter.wait("10.0.0.2") == 0.0  # another address has its own bucket
    clock.now += 4.0
    assert limiter.wait("10.0.0.1") == pytest.approx(6.0)  # a refused request costs nothing
    clock.now += 6.0
    assert limiter.wait("10.0.0.1") == 0.0
    assert limiter.wait("10.0.0.1") == pytest.approx(10.0)
    clock.now += 1000.0  # refills up to the burst, no further
    assert [limiter.wait("10.0.0.1") for _ in range(4)][-2:] == [0.0, pytest.approx(10.0)]


def test_exempt_addresses_are_never_limited() -> None:
    """Loopback by default (a reverse proxy on this machine); other addresses are."""
    limiter = RateLimiter(1, 1, exempt=networks(["127.0.0.0/8", "::1"]), clock=Clock())
    assert [limiter.wait("127.0.0.1") for _ in range(100)] == [0.0] * 100
    assert limiter.wait("192.168.1.9") == 0.0 and limiter.wait("192.168.1.9") > 0


def test_the_table_of_addresses_stays_bounded() -> None:
    """Past max_addresses the one seen longest ago is forgotten (its bucket was full)."""
    clock = Clock()
    limiter = RateLimiter(1, 1, clock=clock, max_addresses=10)
    for n in range(1000):
        limiter.wait(f"10.0.{n >> 8}.{n & 255}")
    assert len(limiter._buckets) == 10
    assert limiter.wait("10.0.3.231") > 0  # the newest is remembered


def test_configured_limiters_follow_the_limits_table(tmp_path: Path) -> None:
    """ota_* and enroll_* keys, and the exempt addresses, reach the limiters."""
    config = make_config(tmp_path, limits_ota_burst=2, limits_enroll_burst=1)
    ota, enroll = configured_limiter(config, "ota"), configured_limiter(config, "enroll")
    assert (ota.burst, ota.rate) == (2.0, 20 / 60) and (enroll.burst, enroll.rate) == (1, 10 / 60)
    assert enroll.wait("::1") == 0.0 and enroll.wait("::1") == 0.0


def request_from(host: str) -> Request:
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "client": (host, 1)}
    return Request(scope)


async def test_over_the_rate_a_handler_answers_429_with_retry_after() -> None:
    """The handler runs within the rate; beyond it: 429, a JSON reason and Retry-After."""
    calls: list[str] = []

    async def handler(request: Request) -> Response:
        calls.append(request.client.host if request.client else "")
        return JSONResponse({"ok": True})

    clock = Clock()
    limited = rate_limited(handler, RateLimiter(30, 1, clock=clock), "OTA check-ins")
    assert (await limited(request_from("10.0.0.1"))).status_code == 200
    refused = await limited(request_from("10.0.0.1"))
    assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
    body = json.loads(bytes(refused.body))
    assert body == {
        "error": "too many OTA check-ins from this address; retry in 2 s",
        "retry_after": 2.0,
    }
    clock.now += 2.0
    assert (await limited(request_from("10.0.0.1"))).status_code == 200
    assert calls == ["10.0.0.1", "10.0.0.1"]
