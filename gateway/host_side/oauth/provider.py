"""The SDK's ``OAuthAuthorizationServerProvider`` over the gateway's store, consent and audit.

The SDK's handlers (``mcp.server.auth.handlers``) parse and check each request (PKCE S256, the
redirect URI, client authentication); this provider decides: which apps exist (registered ones, and
those a client metadata document describes), what the owner consented to (``consent.py`` makes
the grant and its code), and what each code and token is worth. A code presented twice means
someone copied it: the grant it came from is revoked at once (RFC 9700). A rotated refresh token
gets the pair it was spent for again within a short grace period (two refreshes racing, or the
retry of an answer lost in a crash); presented after it, it is a replay and revokes the grant.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    AuthorizeError,
    OAuthAuthorizationServerProvider,
    RefreshToken,
    RegistrationError,
)
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from gateway.config import Config
from gateway.devices.audit import Actor, AuditLog
from gateway.devices.subscribers import Subscribers, Unsubscribe
from gateway.host_side.device_scope import scope_words
from gateway.host_side.oauth.client_documents import (
    ClientDocumentError,
    ClientDocuments,
    is_document_id,
)
from gateway.host_side.oauth.consent_requests import ConsentRequests
from gateway.host_side.oauth.credentials import credential_client
from gateway.host_side.oauth.origin import CURRENT
from gateway.host_side.oauth.redirects import PkceClient, refuse_redirects
from gateway.host_side.oauth.store import (
    ACCESS,
    CODE,
    REFRESH,
    REFRESH_GRACE,
    Grant,
    OAuthStore,
    new_secret,
)
from gateway.net.networks import networks

__all__ = ["SCOPES", "GatewayProvider"]

logger = logging.getLogger(__name__)

# What an app may be granted: listing devices (and their tools), and calling tools. The
# dashboard's admin actions have no scope: an app's token is accepted on the MCP paths only.
SCOPES = ("devices.list", "tools.call")
CODE_LIFETIME = 120.0


class GatewayProvider(
    OAuthAuthorizationServerProvider[AuthorizationCode, RefreshToken, AccessToken]
):
    """Apps, grants and tokens for the host listener (the SDK's provider protocol)."""

    def __init__(
        self,
        config: Config,
        store: OAuthStore,
        documents: ClientDocuments,
        consents: ConsentRequests,
        audit: AuditLog,
    ) -> None:
        self.config, self.store, self.documents = config, store, documents
        self.consents, self.audit = consents, audit
        self._revoked: Subscribers[[str]] = Subscribers()  # the client id of ended grants
        self._devices_changed: Subscribers[[str]] = Subscribers()  # ... of apps' devices
        self.http_networks = networks(config.oauth_http_networks)  # plain-HTTP redirects too

    def subscribe_revoked(self, watcher: Callable[[str], object]) -> Unsubscribe:
        """Tell ``watcher`` the client id of each app whose grants end, from now on (however
        they end: revoked by the owner or the app, or a refresh token presented twice)."""
        return self._revoked.subscribe(watcher)

    def subscribe_devices(self, watcher: Callable[[str], object]) -> Unsubscribe:
        """Tell ``watcher`` the client id of each app the owner gives other devices, from now
        on (``set_devices``)."""
        return self._devices_changed.subscribe(watcher)

    # --- apps ---------------------------------------------------------------------------------

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        """App credentials the owner made, a registered app, or the one a (fetched, checked)
        metadata document describes."""
        credential = self.store.credential(client_id)
        if credential is not None:
            return credential_client(credential)
        if is_document_id(client_id):
            try:
                client = await self.documents.get(client_id)
            except ClientDocumentError as exc:
                logger.warning("client metadata document refused: %s", exc)
                return None
            described = client.model_dump(mode="json")
            return PkceClient.model_validate({**described, "scope": " ".join(SCOPES)})
        info = self.store.client(client_id)
        return PkceClient.model_validate(info) if info else None

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        """Save an app that registered itself (RFC 7591), within the cap on apps."""
        uris = [str(uri) for uri in client_info.redirect_uris or ()]
        refusal = await refuse_redirects(uris, self.http_networks)
        if refusal is not None:
            raise RegistrationError("invalid_redirect_uri", refusal)
        address = _address()
        kept = self.store.prune_clients(address, self.config.oauth_max_clients)
        if kept >= self.config.oauth_max_clients:
            raise RegistrationError(
                "invalid_client_metadata",
                f"this gateway has {kept} allowed apps, its limit ([oauth] max_clients): "
                "revoke one under Connected apps on the dashboard",
            )
        self.store.save_client(client_info.client_id, client_info.model_dump(mode="json"), address)
        name = client_info.client_name or "unnamed app"
        self._audit("register", name, client_info.client_id, address)

    # --- authorization ------------------------------------------------------------------------

    async def authorize(
        self, client: OAuthClientInformationFull, params: AuthorizationParams
    ) -> str:
        """Hold the request for the owner's consent; send the browser to the consent page."""
        origin = CURRENT.get()
        if params.resource is not None and not _same_resource(params.resource, origin.resource):
            raise AuthorizeError(
                "invalid_target",
                f"this server is the resource {origin.resource}, not {params.resource}",
            )
        request_id = self.consents.hold(client, params, origin)
        return f"consent?request={request_id}"  # relative: it works behind a path prefix

    def grant(
        self,
        client: OAuthClientInformationFull,
        params: AuthorizationParams,
        resource: str,
        actor: Actor,
        devices: tuple[str, ...] | None = None,
    ) -> str:
        """The owner said yes: save the grant and its code (before the app sees it); the app
        may use ``devices`` (ids and name globs), or every device when None."""
        code = new_secret("gwc_")
        grant = Grant(
            id=new_secret(""),
            client_id=client.client_id,
            client_name=_name(client),
            scopes=tuple(params.scopes or SCOPES),
            resource=resource,
            redirect=str(params.redirect_uri),
            granted_at=self.store.clock(),
            last_used=None,
            revoked_at=None,
            devices=devices,
        )
        extra = {
            "challenge": params.code_challenge,
            "explicit": params.redirect_uri_provided_explicitly,
        }
        self.store.add_grant(grant, code, self.store.clock() + CODE_LIFETIME, extra)
        self._audit(
            "grant",
            grant.client_name,
            client.client_id,
            actor.where,
            actor.who,
            f"scopes {' '.join(grant.scopes)}; devices: {scope_words(devices)}; "
            f"redirect to {grant.redirect}",
        )
        return code

    def refused(self, client: OAuthClientInformationFull, actor: Actor) -> None:
        """The owner said no."""
        self._audit("deny", _name(client), client.client_id, actor.where, actor.who)

    async def load_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: str
    ) -> AuthorizationCode | None:
        """The code, if unused; a replayed code revokes the grant it made."""
        found = self.store.find(authorization_code)
        if found is None or found.kind != CODE or found.grant.client_id != client.client_id:
            return None
        if found.used:
            self._replayed(found.grant, "an authorization code")
            return None
        return AuthorizationCode(
            code=authorization_code,
            scopes=list(found.grant.scopes),
            expires_at=found.expires,
            client_id=found.grant.client_id,
            code_challenge=found.extra["challenge"],
            redirect_uri=found.grant.redirect,  # type: ignore[arg-type]
            redirect_uri_provided_explicitly=found.extra["explicit"],
            resource=found.grant.resource,
        )

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        """Tokens for a code (which can never be redeemed again)."""
        found = self.store.find(authorization_code.code)
        assert found is not None  # loaded just before, on the same loop turn
        return self._tokens(found.grant, authorization_code.code)

    async def load_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: str
    ) -> RefreshToken | None:
        """The refresh token, if current or spent within the grace period; a rotated one
        presented after it revokes the grant."""
        found = self.store.find(refresh_token)
        if found is None or found.kind != REFRESH or found.grant.client_id != client.client_id:
            return None
        spent_at = found.extra.get("spent_at")
        if found.used and (spent_at is None or self.store.clock() - spent_at > REFRESH_GRACE):
            self._replayed(found.grant, "a rotated refresh token")
            return None
        return RefreshToken(
            token=refresh_token,
            client_id=found.grant.client_id,
            scopes=list(found.grant.scopes),
            expires_at=int(found.expires),
            resource=found.grant.resource,
        )

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        """New tokens for a refresh token, which is spent (rotation); the same new tokens for
        one spent within the grace period."""
        found = self.store.find(refresh_token.token)
        assert found is not None
        grant, config = found.grant, self.config
        issued = self.store.rotate(
            grant.id,
            refresh_token.token,
            config.oauth_access_token_lifetime,
            config.oauth_refresh_token_lifetime,
        )
        logger.debug("app %r refreshed its tokens", grant.client_name)  # (committed)
        again = " again (within the grace period)" if found.used else ""
        self._audit(
            "refresh", grant.client_name, client.client_id, _address(), apart=False,
            message=f"tokens refreshed{again}",
        )  # fmt: skip
        return OAuthToken(
            access_token=issued.access,
            token_type="Bearer",
            expires_in=max(0, int(issued.access_expires - self.store.clock())),
            scope=" ".join(scopes or grant.scopes),
            refresh_token=issued.refresh,
        )

    async def load_access_token(self, token: str) -> AccessToken | None:
        """The access token, if it is one, current and its grant alive."""
        found = self.store.find(token)
        if found is None or found.kind != ACCESS or found.expires < self.store.clock():
            return None
        grant = found.grant
        self.store.used(grant.id)
        return AccessToken(
            token=token,
            client_id=grant.client_id,
            scopes=list(grant.scopes),
            expires_at=int(found.expires),
            resource=grant.resource,
            # devices: read from the grant at every request, so the owner's edit counts at once
            claims={
                "app": grant.client_name,
                "grant": grant.id,
                "devices": list(grant.devices) if grant.devices is not None else None,
            },
        )

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        """RFC 7009: the app gives a token up; the whole grant ends with it."""
        found = self.store.find(token.token)
        if found is not None:
            self.store.revoke_grant(found.grant.id)
            self._audit(
                "revoke",
                found.grant.client_name,
                found.grant.client_id,
                _address(),
                message="revoked by the app (RFC 7009)",
            )
            self._ended(found.grant.client_id)

    def set_devices(
        self, client_id: str, devices: tuple[str, ...] | None, actor: Actor
    ) -> Grant | None:
        """The owner changes which devices an app may use (Connected apps): every live grant of
        it, from the app's next request on. Returns one of them, or None for no such app."""
        if not self.store.set_devices(client_id, devices):
            return None
        grant = next(g for g in self.store.grants(client_id) if g.revoked_at is None)
        self._audit(
            "devices", grant.client_name, client_id, actor.where, actor.who,
            f"may now use {scope_words(devices)}",
        )  # fmt: skip
        self._devices_changed.notify(client_id)
        return grant

    def revoke_app(self, client_id: str, actor: Actor) -> list[Grant]:
        """The owner revokes an app on the dashboard: every grant of it ends now."""
        ended = self.store.revoke_client(client_id)
        if ended:
            self._audit("revoke", ended[0].client_name, client_id, actor.where, actor.who)
            self._ended(client_id)
        return ended

    # --- helpers ------------------------------------------------------------------------------

    def _tokens(self, grant: Grant, spent: str) -> OAuthToken:
        access, refresh = new_secret("gwa_"), new_secret("gwr_")
        now = self.store.clock()
        lifetime = self.config.oauth_access_token_lifetime
        self.store.issue(
            grant.id,
            spent,
            {
                ACCESS: (access, now + lifetime),
                REFRESH: (refresh, now + self.config.oauth_refresh_token_lifetime),
            },
        )
        return OAuthToken(
            access_token=access,
            token_type="Bearer",
            expires_in=int(lifetime),
            scope=" ".join(grant.scopes),
            refresh_token=refresh,
        )

    def _replayed(self, grant: Grant, what: str) -> None:
        self.store.revoke_grant(grant.id)
        logger.warning("%s of %s was used twice: its grant is revoked", what, grant.client_name)
        self._audit(
            "revoke",
            grant.client_name,
            grant.client_id,
            _address(),
            outcome="refused",
            message=f"{what} was presented twice: the grant is revoked",
        )
        self._ended(grant.client_id)

    def _ended(self, client_id: str) -> None:
        self._revoked.notify(client_id)

    def _audit(
        self,
        action: str,
        name: str,
        client_id: str,
        where: str | None,
        who: str = "oauth",
        message: str | None = None,
        outcome: str = "ok",
        apart: bool = True,
    ) -> None:
        detail = f"app {name!r} ({client_id})" + (f": {message}" if message else "")
        self.audit.event(
            "oauth", action, Actor(who, where), device_id=None, outcome=outcome, message=detail,
            apart=apart,
        )  # fmt: skip


def _name(client: OAuthClientInformationFull) -> str:
    return (client.client_name or client.client_id)[:100]


def _address() -> str | None:
    origin = CURRENT.get(None)
    return origin.address if origin else None


def _same_resource(given: str, ours: str) -> bool:
    return given.rstrip("/").lower() == ours.rstrip("/").lower()
