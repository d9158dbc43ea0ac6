"""Per-device MQTT passwords, derived from one secret so that nothing per device is stored.

The OTA endpoint hands a stock device ``password_for(device_id)`` at every boot; the embedded
broker recomputes it when the device connects. HMAC-SHA256 of the device id under a random
secret kept in the data dir (``mqtt_secret``, mode 0600): a password admits one device id only,
and deleting the file revokes them all (devices get new ones at their next boot).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

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
    if path.exists():
        text = path.read_text(encoding="utf-8").strip()
        if text:
            return text.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_hex(32)
    # Write-then-rename, 0600 from the start: whoever reads it can log in as any device.
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(secret + "\n")
    tmp.replace(path)
    return secret.encode()
