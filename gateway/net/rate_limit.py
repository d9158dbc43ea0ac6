"""Request rates per remote address: a token bucket each, and a 429 in front of a handler.

``RateLimiter`` is bookkeeping (a clock in, seconds to wait out) with the throttled log of its
refusals. ``rate_limited()`` puts one
in front of a Starlette request handler: over the rate, the answer is 429 with a JSON body that
says why and when to come back, and a ``Retry-After`` header. The OTA endpoint and ``/api/enroll``
use it (``[limits]``); a stock device checks in once per boot, far below the defaults.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.config import Config
from gateway.net.limits import ThrottledLog
from gateway.net.networks import Network, in_networks, networks

__all__ = ["RateLimiter", "configured_limiter", "rate_limited", "refusal"]

logger = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]


class RateLimiter:
    """A token bucket per address: ``burst`` requests at once, refilled at ``per_minute``."""

    def __init__(
        self,
        per_minute: float,
        burst: int,
        *,
        exempt: Sequence[Network] = (),
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = 10_000,
    ) -> None:
        self.rate = per_minute / 60.0  # tokens a second
        self.burst = float(burst)
        self._exempt = tuple(exempt)
        self._clock = clock
        self._max = max_addresses
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, when
        self.log = ThrottledLog(logger)  # its 429s, at a bounded rate, whichever path answers

    def wait(self, address: str) -> float:
        """Take a token for ``address``: 0.0 when it may go ahead, else seconds until it may."""
        if in_networks(address, self._exempt):
            return 0.0
        now = self._clock()
        tokens, then = self._buckets.pop(address, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        wait = 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate
        self._buckets[address] = (tokens - 1.0 if not wait else tokens, now)
        if len(self._buckets) > self._max:  # forget the address seen longest ago: a full bucket
            self._buckets.popitem(last=False)
        return wait


def configured_limiter(config: Config, requests: str) -> RateLimiter:
    """The ``[limits]`` rate of ``ota`` or ``enroll`` requests."""
    ota = requests == "ota"
    return RateLimiter(
        config.limits_ota_per_minute if ota else config.limits_enroll_per_minute,
        config.limits_ota_burst if ota else config.limits_enroll_burst,
        exempt=networks(config.limits_exempt_addresses),
    )


def refusal(limiter: RateLimiter, address: str, what: str) -> Response | None:
    """None when ``address`` may make one more of ``what`` now; else the 429 that says why and
    when to come back (``Retry-After``), logged at a bounded rate."""
    wait = limiter.wait(address)
    if not wait:
        return None
    limiter.log.warning("429", "too many %s from %s: answered 429", what, address or "?")
    seconds = math.ceil(wait)
    body = {
        "error": f"too many {what} from this address; retry in {seconds} s",
        "retry_after": round(wait, 3),
    }
    return JSONResponse(body, 429, headers={"Retry-After": str(seconds)})


def rate_limited(handler: Handler, limiter: RateLimiter, what: str) -> Handler:
    """``handler`` behind ``limiter``: 429 and ``Retry-After`` for an address over its rate."""

    async def limited(request: Request) -> Response:
        address = request.client.host if request.client else ""
        refused = refusal(limiter, address, what)
        return await handler(request) if refused is None else refused

    return limited
