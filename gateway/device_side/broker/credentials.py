"""Per-device credentials for stock devices, derived from one secret: nothing per device stored.

The OTA endpoint hands a stock device ``password_for(device_id, client_id)`` at every boot (its
MQTT password, or its WebSocket token); the gateway recomputes it when the device logs in.
HMAC-SHA256 of the device id *and* the stock firmware's persistent Client-Id UUID under a random
secret kept in the data dir (``mqtt_secret``, mode 0600): a credential admits one device id as
presented by one Client-Id. Someone who checks in with a device's MAC but another Client-Id gets
other credentials, which a device bound to its Client-Id refuses (DESIGN.md "Who becomes a
device"). Deleting the file revokes them all (devices get new ones at their next boot).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from gateway.devices.tokens import stored_secret

__all__ = ["DeviceCredentials"]

_SECRET_FILE = "mqtt_secret"
_PASSWORD_CHARS = 32  # 128 bits in hex: short enough for the device's NVS, long enough to guess


class DeviceCredentials:
    """Derives and checks per-device MQTT passwords."""

    def __init__(self, data_dir: Path) -> None:
        self._secret = _load_or_create(data_dir / _SECRET_FILE)

    def password_for(self, device_id: str, client_id: str | None) -> str:
        """The credential of ``device_id`` presenting ``client_id`` (case-insensitive id)."""
        message = f"mqtt:{device_id.lower()}\0{client_id or ''}".encode()
        digest = hmac.new(self._secret, message, hashlib.sha256)
        return digest.hexdigest()[:_PASSWORD_CHARS]

    def binding_key(self) -> bytes:
        """The key that seals identity bindings in the cluster's records (tokens.seal): the
        replicas share ``mqtt_secret``, and whoever holds it could mint credentials anyway."""
        return hmac.new(self._secret, b"fleet bindings", hashlib.sha256).digest()

    def admits(self, device_id: str, client_id: str | None, password: str) -> bool:
        """True if ``password`` is the credential of ``device_id`` with ``client_id``."""
        expected = self.password_for(device_id, client_id).encode()
        return hmac.compare_digest(expected, password.encode())


def _load_or_create(path: Path) -> bytes:
    # Whoever reads this file can log in as any device: stored_secret keeps it 0600.
    return stored_secret(path, lambda: secrets.token_hex(32)).encode()
