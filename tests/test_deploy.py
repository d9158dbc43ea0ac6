"""The Docker deployment's first run (issue 30): deploy/env.example as shipped sends devices
nowhere in particular, and the image's data dir is private from the start."""

from __future__ import annotations

import re
from pathlib import Path

from gateway.config import load_config

ROOT = Path(__file__).resolve().parent.parent


def shipped_env() -> dict[str, str]:
    """The settings deploy/env.example sets as shipped (what `cp` to .env gives compose)."""
    pairs = re.findall(r"^([A-Z_]+)=(.*)$", (ROOT / "deploy/env.example").read_text(), re.M)
    return dict(pairs)


def test_env_example_sets_no_live_device_url(tmp_path: Path) -> None:
    """A user who fills in only the host token gets the derived address, not someone's LAN."""
    env = shipped_env()
    assert env["GATEWAY_DEVICE_URL"] == ""
    settings = {k: v for k, v in env.items() if k.startswith("GATEWAY_")}
    config = load_config(env={**settings, "GATEWAY_DATA_DIR": str(tmp_path)})
    assert config.public_url is None


def test_the_image_makes_its_data_dir_private() -> None:
    """A named volume starts as a copy of the image's /data: 0700, so no tightening warning."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"chmod 0700 /data\b", dockerfile)
