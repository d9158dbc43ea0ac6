"""Authorization requests waiting for the owner's answer on the consent page (in memory).

A request lives ``LIFETIME`` seconds; at most ``MAX_WAITING`` wait (the oldest goes first), so
apps that start flows nobody finishes cannot grow memory. Each showing of the page gets a fresh
CSRF secret, which the form must send back along with the same value in a SameSite=Strict cookie:
another site can neither read the form nor make the browser send the cookie.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from mcp.server.auth.provider import AuthorizationParams
from mcp.shared.auth import OAuthClientInformationFull

from gateway.host_side.oauth.origin import Origin

__all__ = ["ConsentRequest", "ConsentRequests"]

LIFETIME = 600.0
MAX_WAITING = 1000


@dataclass(slots=True)
class ConsentRequest:
    """One app's request, as the SDK checked it, and where it came in."""

    client: OAuthClientInformationFull
    params: AuthorizationParams
    origin: Origin
    expires: float
    csrf: str = field(default="")


class ConsentRequests:
    """The waiting requests, by their unguessable id."""

    def __init__(self) -> None:
        self._waiting: OrderedDict[str, ConsentRequest] = OrderedDict()

    def hold(
        self, client: OAuthClientInformationFull, params: AuthorizationParams, origin: Origin
    ) -> str:
        """Keep a request; returns its id."""
        request_id = secrets.token_urlsafe(24)
        self._waiting[request_id] = ConsentRequest(
            client, params, origin, time.monotonic() + LIFETIME
        )
        while len(self._waiting) > MAX_WAITING:
            self._waiting.popitem(last=False)
        return request_id

    def get(self, request_id: str) -> ConsentRequest | None:
        """The request, if it still waits."""
        request = self._waiting.get(request_id)
        if request is not None and request.expires < time.monotonic():
            del self._waiting[request_id]
            return None
        return request

    def show(self, request_id: str) -> tuple[ConsentRequest, str] | None:
        """The request and a fresh CSRF secret for the page about to show it."""
        request = self.get(request_id)
        if request is None:
            return None
        request.csrf = secrets.token_urlsafe(24)
        return request, request.csrf

    def check(self, request_id: str, form_csrf: str, cookie_csrf: str) -> ConsentRequest | None:
        """The request, when both CSRF copies match the page's; else None."""
        request = self.get(request_id)
        if request is None or not request.csrf:
            return None
        expected = request.csrf.encode()
        if not (
            hmac.compare_digest(form_csrf.encode(), expected)
            and hmac.compare_digest(cookie_csrf.encode(), expected)
        ):
            return None
        return request

    def drop(self, request_id: str) -> None:
        """Forget a request that was answered."""
        self._waiting.pop(request_id, None)
