"""App credentials the owner makes (gateway/host_side/oauth/credentials.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp.shared.auth import OAuthClientInformationFull

from gateway.devices.audit import Actor, AuditLog
from gateway.host_side.oauth.credentials import AppCredentials, CredentialError, credential_client
from gateway.host_side.oauth.redirects import PkceClient
from gateway.host_side.oauth.store import OAuthStore, digest

pytestmark = pytest.mark.anyio

OWNER = Actor("dashboard", "127.0.0.1")
MY = "https://my.home-assistant.io/redirect/oauth"


async def test_credentials_keep_only_the_secrets_digest_and_the_pkce_mark(tmp_path: Path) -> None:
    """The secret is handed out once; the store keeps its SHA-256; a marked app matches its
    redirect exactly (no loopback port freedom), an unmarked one is held to PKCE."""
    store = OAuthStore(tmp_path / "oauth.sqlite3")
    made = AppCredentials(store, AuditLog(None), ())
    marked, secret = await made.create("Home Assistant", MY, True, OWNER)
    unmarked, _ = await made.create("Other", MY, False, OWNER)
    kept = store.credential(marked.client_id)
    assert kept is not None and kept.secret == digest(secret) and kept.no_pkce
    assert secret not in (tmp_path / "oauth.sqlite3").read_bytes().decode("latin-1")
    assert type(credential_client(kept)) is OAuthClientInformationFull
    assert isinstance(credential_client(unmarked), PkceClient)
    assert made.delete(marked.client_id, OWNER) is not None
    assert store.credential(marked.client_id) is None
    assert made.delete(marked.client_id, OWNER) is None
    store.close()


async def test_unusable_names_and_redirect_uris_are_refused(tmp_path: Path) -> None:
    """No name, a long one, or a plain-HTTP redirect off loopback: a clear refusal."""
    store = OAuthStore(tmp_path / "oauth.sqlite3")
    made = AppCredentials(store, AuditLog(None), ())
    for name, uri in (("", MY), ("x" * 101, MY), ("HA", "http://192.168.1.10:8123/cb"),
                      ("HA", "javascript:alert(1)")):  # fmt: skip
        with pytest.raises(CredentialError):
            await made.create(name, uri, True, OWNER)
    assert store.credentials() == []
    store.close()
