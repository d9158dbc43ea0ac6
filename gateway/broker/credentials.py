"""Per-device MQTT passwords, derived from one secret so that nothing per device is stored.

The OTA endpoint hands a stock device ``password_for(device_id)`` at every boot; the embedded
broker recomputes it when the device connects. HMAC-SHA256 of the device id under a random
secret kept in the data dir (``mqtt_secret``, mode 0600): a password admits one device id only,
and deleting the file revokes them all (devices get new ones at their next boot).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from gateway.tokens import stored_secret

__all__ = ["DeviceCredentials"]

_SECRET_FILE = "mqtt_secret"
_PASSWORD_CHARS = 32  # 128 bits in hex: short enough for the device's NVS, long enough to guess


class DeviceCredentials:
    """Derives and checks per-device MQTT passwords."""

    def __init__(self, data_dir: Path) -> None:
        self._secret = _load_or_create(data_dir / _SECRET_FILE)

    def password_for(self, device_id: str) -> str:
        """The MQTT password of ``device_id`` (case-insensitive id)."""
        digest = hmac.new(self._secret, b"mqtt:" + device_id.lower().encode(), hashlib.sha256)
        return digest.hexdigest()[:_PASSWORD_CHARS]

    def admits(self, device_id: str, password: str) -> bool:
        """True if ``password`` is the derived password of ``device_id`` (constant time)."""
        return hmac.compare_digest(self.password_for(device_id).encode(), password.encode())


def _load_or_create(path: Path) -> bytes:
    # Whoever reads this file can log in as any device: stored_secret keeps it 0600.
    return stored_secret(path, lambda: secrets.token_hex(32)).encode()
