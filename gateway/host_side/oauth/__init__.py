"""The host listener as an OAuth 2.1 authorization server for its own MCP endpoint.

``site.OAuthSite`` assembles it on the MCP SDK's auth handlers: ``provider`` (apps, grants,
codes, tokens), ``store`` (kept hashed in ``oauth.sqlite3``), ``client_documents`` (client ID
metadata documents, fetched with limits), ``redirects`` (which redirect URIs match),
``credentials`` (app credentials the owner makes), ``consent`` (the owner's page), ``origin``
(issuer and resource per request), ``guard`` (which token opens which route), ``apps``
(Connected apps).
"""

from gateway.host_side.oauth.apps import ConnectedApps
from gateway.host_side.oauth.guard import BearerTokens, token_check
from gateway.host_side.oauth.origin import OriginRules
from gateway.host_side.oauth.provider import SCOPES
from gateway.host_side.oauth.site import OAuthSite

__all__ = ["SCOPES", "BearerTokens", "ConnectedApps", "OAuthSite", "OriginRules", "token_check"]
