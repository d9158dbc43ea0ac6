"""App credentials: a client id and secret the owner makes for an app that cannot register itself.

Home Assistant 2026.11 is such an app: its user types Application Credentials (client id and
secret), and it sends no PKCE (``LocalOAuth2Implementation``). Credentials are a confidential
client: the secret (shown once, kept as its SHA-256 only) is required at the token endpoint, in
the form (``client_secret_post``, as Home Assistant sends it) or in a Basic header
(``client_secret_basic``). They are never pruned and never count against ``[oauth] max_clients``.

OAuth 2.1 requires PKCE. An authorization request without it is accepted only for credentials
the owner marked, when making them, as an app that cannot send PKCE; their redirect URI then
matches exactly (no loopback port exception). The SDK's handlers require a PKCE challenge and
verifier, so for such a request the gateway fills in a fixed pair derived from the client id:
what guards the code is then the client secret, as for any confidential client of OAuth 2.0.
A marked app that does send PKCE is held to it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
import urllib.parse
from typing import Any

from mcp.server.auth.middleware.client_auth import AuthenticationError, ClientAuthenticator
from mcp.shared.auth import OAuthClientInformationFull
from starlette.datastructures import FormData, QueryParams
from starlette.requests import Request

from gateway.compat.starlette import parsed_form, replace_form
from gateway.devices.audit import Actor, AuditLog
from gateway.host_side.oauth.redirects import PkceClient, refuse_redirects
from gateway.host_side.oauth.store import Credential, OAuthStore, digest, new_secret
from gateway.net.networks import Network

__all__ = [
    "CREDENTIAL_PREFIX",
    "AppCredentials",
    "CredentialAuthenticator",
    "CredentialError",
    "credential_client",
    "describe",
    "without_pkce",
]

CREDENTIAL_PREFIX = "gwapp-"
MAX_NAME = 100
_SCOPE = "devices.list tools.call"


class CredentialError(ValueError):
    """App credentials cannot be made as asked; the message says why."""


def credential_client(credential: Credential) -> OAuthClientInformationFull:
    """The app the SDK's handlers see for ``credential`` (its secret is checked elsewhere)."""
    kind = OAuthClientInformationFull if credential.no_pkce else PkceClient
    return kind.model_validate(credential.info)


class AppCredentials:
    """Make, list and delete app credentials (the dashboard's Connected apps and the CLI)."""

    def __init__(self, store: OAuthStore, audit: AuditLog, http_networks: tuple[Network, ...]):
        self.store, self.audit, self.http_networks = store, audit, http_networks

    async def create(
        self, name: str, redirect_uri: str, no_pkce: bool, actor: Actor
    ) -> tuple[Credential, str]:
        """New credentials and their secret (which is never shown again).

        Raises:
            CredentialError: the name or the redirect URI is unusable.
        """
        name = name.strip()
        if not name or len(name) > MAX_NAME:
            raise CredentialError(f"the app needs a name of 1 to {MAX_NAME} characters")
        refusal = await refuse_redirects([redirect_uri], self.http_networks)
        if refusal is not None:
            raise CredentialError(refusal)
        client_id, secret = CREDENTIAL_PREFIX + secrets.token_hex(8), new_secret("gws_")
        info = {
            "client_id": client_id,
            "client_name": name,
            "redirect_uris": [redirect_uri],
            "token_endpoint_auth_method": "client_secret_post",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
            "scope": _SCOPE,
        }
        try:
            credential_client(Credential(client_id, info, "", no_pkce, 0.0))
        except ValueError as exc:  # pydantic: not a URL it accepts
            raise CredentialError(f"{redirect_uri!r} is not a usable redirect URI") from exc
        credential = Credential(client_id, info, digest(secret), no_pkce, time.time())
        self.store.save_credential(credential)
        pkce = "without PKCE (marked by the owner)" if no_pkce else "with PKCE"
        self._audit("credential", actor, f"app {name!r} ({client_id}) made, {pkce}")
        return credential, secret

    def delete(self, client_id: str, actor: Actor) -> Credential | None:
        """Forget credentials (their grants are revoked by the caller); the ones forgotten."""
        credential = self.store.credential(client_id)
        if credential is None or not self.store.delete_credential(client_id):
            return None
        name = credential.info.get("client_name", client_id)
        self._audit("credential", actor, f"app {name!r} ({client_id}) deleted")
        return credential

    def _audit(self, action: str, actor: Actor, message: str) -> None:
        self.audit.event("oauth", action, actor, device_id=None, outcome="ok", message=message)


def describe(credential: Credential) -> dict[str, Any]:
    """What the dashboard and the CLI show of credentials (never the secret)."""
    return {
        "client_id": credential.client_id,
        "name": credential.info.get("client_name"),
        "redirect_uri": (credential.info.get("redirect_uris") or [""])[0],
        "no_pkce": credential.no_pkce,
        "token_endpoint_auth_method": "client_secret_post or client_secret_basic",
    }


def _stand_in_verifier(client_id: str) -> str:
    """The PKCE verifier filled in for a marked app that sent none (see the module's text)."""
    return f"no-pkce-{client_id}-" + "0" * 43


def _challenge(verifier: str) -> str:
    sha = hashlib.sha256(verifier.encode()).digest()
    return base64.urlsafe_b64encode(sha).decode().rstrip("=")


def without_pkce(request: Request, credential: Credential) -> Request:
    """``request`` (an authorization request of a marked app with no ``code_challenge``) with
    the stand-in challenge, so that the SDK's handler takes it."""
    added = [
        ("code_challenge", _challenge(_stand_in_verifier(credential.client_id))),
        ("code_challenge_method", "S256"),
    ]
    if request.method == "GET":
        query = urllib.parse.urlencode([*request.query_params.multi_items(), *added])
        return Request({**request.scope, "query_string": query.encode()}, request.receive)
    form = parsed_form(request)  # parsed by the caller; Starlette hands the handler this copy
    assert form is not None
    replace_form(request, FormData([*form.multi_items(), *added]))
    return request


def lacks_pkce(params: QueryParams | FormData) -> bool:
    """True for an authorization request that carries no PKCE challenge."""
    return not params.get("code_challenge")


class CredentialAuthenticator(ClientAuthenticator):
    """The SDK's client authentication, plus app credentials: their secret (post or Basic)
    checked against its digest; for a marked app's code without a verifier, the stand-in."""

    def __init__(self, provider: Any, store: OAuthStore) -> None:
        super().__init__(provider)
        self.store = store

    async def authenticate_request(self, request: Request) -> OAuthClientInformationFull:
        """The app ``request`` authenticates as.

        Raises:
            AuthenticationError: wrong or missing credentials.
        """
        form = await request.form()
        basic = _basic(request.headers.get("authorization", ""))
        client_id = form.get("client_id") or (basic[0] if basic else None)
        credential = self.store.credential(client_id) if isinstance(client_id, str) else None
        if credential is None:
            return await super().authenticate_request(request)
        secret = form.get("client_secret")
        if basic is not None:
            if basic[0] != credential.client_id:
                raise AuthenticationError("Client ID mismatch in Basic auth")
            secret = basic[1]
        if not isinstance(secret, str) or not secret:
            raise AuthenticationError("Client secret is required")
        if not hmac.compare_digest(digest(secret).encode(), credential.secret.encode()):
            raise AuthenticationError("Invalid client_secret")
        added = [] if "client_id" in form else [("client_id", credential.client_id)]
        code_grant = form.get("grant_type") == "authorization_code"
        if credential.no_pkce and code_grant and "code_verifier" not in form:
            added.append(("code_verifier", _stand_in_verifier(credential.client_id)))
        if added:  # the token handler reads this parsed form again
            replace_form(request, FormData([*form.multi_items(), *added]))
        return credential_client(credential)


def _basic(header: str) -> tuple[str, str] | None:
    """``(client_id, secret)`` of an RFC 6749 §2.3.1 Basic header, or None."""
    if not header.startswith("Basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:], validate=True).decode("utf-8")
    except (ValueError, binascii.Error):
        raise AuthenticationError("Invalid Basic authentication header") from None
    if ":" not in decoded:
        raise AuthenticationError("Invalid Basic authentication header")
    client_id, secret = decoded.split(":", 1)
    return urllib.parse.unquote_plus(client_id), urllib.parse.unquote_plus(secret)
