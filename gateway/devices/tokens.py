"""Device tokens: the configured ones, or one generated at first start and kept in the data dir."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from gateway.config import Config
from gateway.datadir import FILE_MODE, private_dir, tighten

__all__ = [
    "SEALED",
    "TOKEN_BINDING",
    "device_tokens",
    "generated_token_path",
    "new_token",
    "same_identity",
    "seal",
    "token_binding",
    "stored_secret",
    "token_matches",
]


def generated_token_path(config: Config) -> Path:
    """Where the generated device token lives."""
    return config.data_dir / "device_token"


def stored_secret(path: Path, make: Callable[[], str]) -> str:
    """The secret kept in ``path``; made with ``make`` and stored (mode 0600) the first time."""
    private_dir(path.parent)
    if path.exists():
        tighten(path)
        text = path.read_text(encoding="utf-8").strip()
        if text:
            return text
    secret = make()
    # Write-then-rename, 0600 from the start: a secret must never be readable by others.
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)  # a crash's leftover keeps its mode: make the file anew
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(secret + "\n")
    tmp.replace(path)
    return secret


def new_token() -> str:
    """A random URL-safe token that never starts with ``-``.

    One token_urlsafe in 64 would: ``--token "$(esp-mcp-gateway token)"`` then reads as an option.
    """
    while True:
        token = secrets.token_urlsafe(24)
        if not token.startswith("-"):
            return token


def device_tokens(config: Config) -> tuple[str, ...]:
    """The tokens devices may present: the configured ones, else the generated one."""
    if config.device_tokens:
        return config.device_tokens
    return (stored_secret(generated_token_path(config), new_token),)


def token_matches(presented: str | None, tokens: tuple[str, ...]) -> bool:
    """Compare in constant time against every accepted token."""
    if not presented:
        return False
    given = presented.encode()
    return any(hmac.compare_digest(given, t.encode()) for t in tokens)


TOKEN_BINDING = "token:"


def token_binding(token: str) -> str:
    """What a device that presents only ``token`` (an MQTT login) is bound to.

    A login over MQTT carries no Client-Id: a device approved that way is bound to its token
    (a digest; the token itself is never stored). A per-board token (``flash``) binds one board;
    the shared token is the same on every board, so it binds nothing but itself.
    """
    return TOKEN_BINDING + hashlib.sha256(token.encode()).hexdigest()[:16]


SEALED = "sealed:"


def seal(key: bytes, identity: str) -> str:
    """A binding as the cluster's records carry it: a keyed digest, never the identity itself.

    For a stock device the Client-Id is enough to get its credentials at the OTA endpoint, so a
    record anyone on the broker may read must not hold it. The key is one the replicas share
    (derived from ``mqtt_secret``, docs/cluster.md); an identity already sealed stays as it is.
    """
    if identity.startswith(SEALED):
        return identity
    digest = hmac.new(key, identity.encode("utf-8", "surrogateescape"), hashlib.sha256)
    return SEALED + digest.hexdigest()[:32]


def same_identity(held: str, presented: str | None, key: bytes | None) -> bool:
    """Is ``presented`` the identity ``held`` (itself, or sealed with ``key``)?"""
    if presented is None:
        return False
    if held.startswith(SEALED) and not presented.startswith(SEALED):
        return key is not None and hmac.compare_digest(held, seal(key, presented))
    return held == presented
