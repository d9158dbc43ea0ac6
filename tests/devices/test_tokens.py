"""Tests for gateway.devices.tokens: stored secrets are private, and so is the dir they live in."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gateway.cli import _parser, attach_secret_values
from gateway.devices.tokens import (
    device_tokens,
    generated_token_path,
    new_token,
    stored_secret,
    token_matches,
)
from tests.conftest import make_config


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_generated_token_is_kept_0600_in_a_0700_dir(tmp_path: Path) -> None:
    """No configured token: one is made once, kept private, and the same one comes back."""
    config = make_config(tmp_path / "data", device_tokens=())
    (token,) = device_tokens(config)
    path = generated_token_path(config)
    assert (mode(path), mode(path.parent)) == (0o600, 0o700)
    assert device_tokens(config) == (token,) and token_matches(token, (token,))


def test_a_stale_temporary_file_does_not_lend_its_mode(tmp_path: Path) -> None:
    """A 0644 leftover of a crash is replaced, not reused: the secret is 0600 all the same."""
    stale = tmp_path / "mqtt_secret.tmp"
    stale.write_text("half")
    os.chmod(stale, 0o644)
    stored_secret(tmp_path / "mqtt_secret", lambda: "s3cret")
    assert mode(tmp_path / "mqtt_secret") == 0o600 and not stale.exists()


def test_an_existing_looser_secret_is_tightened(tmp_path: Path) -> None:
    """A secret an older version (or a person) left readable is made 0600 and kept as it was."""
    path = tmp_path / "device_token"
    path.write_text("kept\n")
    os.chmod(path, 0o644)
    assert stored_secret(path, lambda: "new") == "kept" and mode(path) == 0o600


def test_generated_tokens_never_start_with_a_dash() -> None:
    """`simulate --token "$(esp-mcp-gateway token)"`: a leading "-" would read as an option."""
    tokens = [new_token() for _ in range(2000)]  # one token_urlsafe in 64 starts with "-"
    assert not [t for t in tokens if t.startswith("-")]
    assert len(set(tokens)) == len(tokens) and min(map(len, tokens)) >= 32


def test_a_token_beginning_with_a_dash_is_taken_as_the_value_of_token() -> None:
    """Tokens made by older versions may begin with "-": `--token -x` still means the value."""
    parser = _parser()
    argv = ["simulate", "--token", "-Ab_c", "--count", "2"]
    args = parser.parse_args(attach_secret_values(parser, argv))
    assert (args.token, args.count) == ("-Ab_c", 2)
    argv = ["stdio", "--connect", "http://gw:8766/mcp", "--token", "--Zq"]
    assert parser.parse_args(attach_secret_values(parser, argv)).token == "--Zq"
    # A missing value is still reported by argparse, not swallowed: the next word is an option.
    assert attach_secret_values(parser, ["simulate", "--token", "--count", "2"])[2] == "--count"
