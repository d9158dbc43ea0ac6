"""The host listener's OAuth 2.1 authorization server: its routes, on the SDK's own handlers.

The SDK's handlers (authorize, token, register, revoke, metadata) do the protocol; they are
mounted here rather than through ``create_auth_routes`` because the issuer is per request: the
URL each request came in on when it names the gateway itself, else the configured remote URL
(``[host] remote_url``, ``origin.py``). Each request that could hand out a token is refused
unless its origin may get one (HTTPS, or plain HTTP on loopback and the owner's listed networks).
Registrations are rate-limited per address and capped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from mcp.server.auth.handlers.authorize import AuthorizationHandler
from mcp.server.auth.handlers.metadata import MetadataHandler, ProtectedResourceMetadataHandler
from mcp.server.auth.handlers.register import RegistrationHandler
from mcp.server.auth.handlers.revoke import RevocationHandler
from mcp.server.auth.handlers.token import TokenHandler
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.routes import build_metadata
from mcp.server.auth.settings import ClientRegistrationOptions, RevocationOptions
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, RequestBodyLimitMiddleware
from mcp.shared.auth import ProtectedResourceMetadata
from starlette.datastructures import FormData
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, request_response
from starlette.types import ASGIApp

from gateway.compat.starlette import replace_form
from gateway.config import Config
from gateway.devices.audit import AuditLog
from gateway.host_side.dashboard.session import Sessions
from gateway.host_side.oauth.client_documents import (
    ClientDocumentError,
    ClientDocuments,
    is_document_id,
)
from gateway.host_side.oauth.consent import ConsentPage, refusal
from gateway.host_side.oauth.consent_requests import ConsentRequests
from gateway.host_side.oauth.credentials import (
    AppCredentials,
    CredentialAuthenticator,
    lacks_pkce,
    without_pkce,
)
from gateway.host_side.oauth.device_choice import Fleet
from gateway.host_side.oauth.guard import AppStreams, RequireToken
from gateway.host_side.oauth.origin import CURRENT, OriginRules
from gateway.host_side.oauth.provider import SCOPES, GatewayProvider
from gateway.host_side.oauth.store import ACCESS, OAuthStore
from gateway.net.networks import networks
from gateway.net.rate_limit import RateLimiter, rate_limited

__all__ = ["OAuthSite"]

logger = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]
_REGISTRATION = ClientRegistrationOptions(
    enabled=True, valid_scopes=list(SCOPES), default_scopes=list(SCOPES)
)
_REVOCATION = RevocationOptions(enabled=True)
_CLIENT_AUTH = ("none", "client_secret_post", "client_secret_basic")
_INSECURE = (
    "tokens are issued only over HTTPS, or over plain HTTP on loopback and the networks "
    "in [oauth] http_networks (docs/remote-access.md)"
)


class OAuthSite:
    """Everything OAuth on the host listener: provider, store, consent page, routes, guard."""

    def __init__(
        self,
        config: Config,
        audit: AuditLog,
        sessions: Sessions | None,
        fleet: Fleet = lambda: (),
    ) -> None:
        self.config = config
        self.rules = OriginRules(config)
        self.store = OAuthStore(config.data_dir / "oauth.sqlite3")
        self.store.expire()  # codes and tokens that ended while the gateway was down
        self.consents = ConsentRequests()
        self.documents = ClientDocuments(networks(config.oauth_metadata_networks))
        self.provider = GatewayProvider(config, self.store, self.documents, self.consents, audit)
        self.streams = AppStreams()
        self.provider.subscribe_revoked(self.streams.end)
        self.consent = ConsentPage(self.provider, self.consents, sessions, fleet)
        self.credentials = AppCredentials(self.store, audit, self.provider.http_networks)
        self._registrations = RateLimiter(
            per_minute=config.oauth_registrations_per_minute,
            burst=max(1, int(config.oauth_registrations_per_minute)),
        )

    def close(self) -> None:
        """Close the store."""
        self.store.close()

    async def verify(self, token: str, conn: HTTPConnection) -> AccessToken | None:
        """An app's access token, if valid and issued for the resource ``conn`` reached."""
        access = await self.provider.load_access_token(token)
        if access is None:
            return None
        ours = self.rules.of(conn).resource
        if (access.resource or "").rstrip("/").lower() != ours.lower():
            logger.warning("a token for %s was presented to %s: refused", access.resource, ours)
            return None
        return access

    def live(self, token: bytes) -> bool:
        """True when ``token`` is a current access token (the connection guard asks)."""
        found = self.store.find(token.decode("latin-1"))
        return found is not None and found.kind == ACCESS and found.expires > self.store.clock()

    def require(self, app: ASGIApp, tokenless: bool) -> ASGIApp:
        """``app`` (an MCP route) behind the token check."""
        return RequireToken(app, self.rules, self.streams, tokenless)

    def routes(self) -> list[BaseRoute]:
        """Discovery, the OAuth endpoints and the consent page."""
        provider = self.provider
        authenticator = CredentialAuthenticator(provider, self.store)
        register = rate_limited(
            RegistrationHandler(provider, _REGISTRATION).handle,
            self._registrations,
            "app registrations",
        )
        return [
            Route("/.well-known/oauth-authorization-server", self._as_metadata, methods=["GET"]),
            Route(
                "/.well-known/oauth-protected-resource", self._resource_metadata, methods=["GET"]
            ),
            Route(
                "/.well-known/oauth-protected-resource/mcp",
                self._resource_metadata,
                methods=["GET"],
            ),
            Route(
                "/authorize",
                self._issuing(self._authorize(AuthorizationHandler(provider).handle)),
                methods=["GET", "POST"],
            ),
            Route(
                "/token",
                self._issuing(TokenHandler(provider, authenticator).handle, tokens=True),
                methods=["POST"],
            ),
            Route("/register", self._issuing(register, tokens=True), methods=["POST"]),
            Route(
                "/revoke",
                self._issuing(
                    _public_revocation(RevocationHandler(provider, authenticator).handle)
                ),
                methods=["POST"],
            ),
            *(
                Route(r.path, self._issuing(r.endpoint), methods=r.methods)
                for r in self.consent.routes()
            ),
        ]

    def _issuing(self, handler: Handler, tokens: bool = False) -> ASGIApp:
        """``handler`` with the request's origin set for the provider; with ``tokens`` (the
        token endpoint, registration), only for origins that may get tokens. The consent page
        and /authorize work over plain HTTP anywhere, as the dashboard does: what they hand out
        is a code, worth nothing without the app's PKCE verifier at the token endpoint."""

        async def issuing(request: Request) -> Response:
            origin = self.rules.of(request)
            if tokens and not origin.may_issue:
                logger.warning(
                    "refused a token request over plain HTTP from %s: list its network "
                    "in [oauth] http_networks, or use HTTPS",
                    origin.address,
                )
                return JSONResponse(
                    {"error": "invalid_request", "error_description": _INSECURE},
                    403,
                    headers={"Cache-Control": "no-store"},
                )
            reset = CURRENT.set(origin)
            try:
                return await handler(request)
            finally:
                CURRENT.reset(reset)

        return RequestBodyLimitMiddleware(request_response(issuing), DEFAULT_MAX_REQUEST_BODY_SIZE)

    def _authorize(self, handler: Handler) -> Handler:
        """The SDK's authorize handler, after a clear refusal of an unusable metadata document;
        a request without PKCE from credentials the owner marked so gets the stand-in; a browser
        (the owner, on the way to consent) gets a refusal as a page, not JSON."""

        async def authorize(request: Request) -> Response:
            params = request.query_params if request.method == "GET" else await request.form()
            client_id = params.get("client_id")
            response: Response | None = None
            credential = self.store.credential(client_id) if isinstance(client_id, str) else None
            if credential is not None and credential.no_pkce and lacks_pkce(params):
                response = await handler(without_pkce(request, credential))
            elif isinstance(client_id, str) and is_document_id(client_id):
                try:
                    await self.documents.get(client_id)
                except ClientDocumentError as exc:
                    response = JSONResponse(
                        {"error": "invalid_client", "error_description": str(exc)}, 400
                    )
            if response is None:
                response = await handler(request)
            if response.status_code >= 400 and "text/html" in request.headers.get("accept", ""):
                return refusal(_reason(response), response.status_code)
            return response

        return authorize

    async def _as_metadata(self, request: Request) -> Response:
        """RFC 8414 metadata, for the issuer this request reached."""
        issuer = self.rules.of(request).issuer  # a string: no trailing slash added (RFC 9207)
        metadata = build_metadata(issuer, None, _REGISTRATION, _REVOCATION)  # type: ignore[arg-type]
        metadata.client_id_metadata_document_supported = True
        metadata.authorization_response_iss_parameter_supported = True
        metadata.token_endpoint_auth_methods_supported = list(_CLIENT_AUTH)
        # Public clients revoke too, with their client_id alone (RFC 7009 §2.1).
        metadata.revocation_endpoint_auth_methods_supported = list(_CLIENT_AUTH)
        return await MetadataHandler(metadata).handle(request)

    async def _resource_metadata(self, request: Request) -> Response:
        """RFC 9728 metadata of the MCP endpoint."""
        origin = self.rules.of(request)
        metadata = ProtectedResourceMetadata.model_validate(
            {
                "resource": origin.resource,
                "authorization_servers": [origin.issuer],
                "scopes_supported": list(SCOPES),
                "resource_name": "esp-mcp-gateway",
            }
        )
        return await ProtectedResourceMetadataHandler(metadata).handle(request)


def _reason(response: Response) -> str:
    """What an OAuth error answer says (RFC 6749 §5.2's ``error_description``, else ``error``)."""
    try:
        answer = json.loads(bytes(getattr(response, "body", b"")))
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return "the request was refused"
    return str(answer.get("error_description") or answer.get("error") or "refused")


def _public_revocation(handler: Handler) -> Handler:
    """The SDK's revocation handler, for public clients too: RFC 7009 §2.1 has them send only
    ``client_id``, but the handler's form model requires a ``client_secret`` field."""

    async def revoke(request: Request) -> Response:
        form = await request.form()
        if "client_secret" not in form:  # Starlette hands the handler this parsed form again
            replace_form(request, FormData([*form.multi_items(), ("client_secret", "")]))
        return await handler(request)

    return revoke
